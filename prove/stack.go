package prove

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/databasesql"
	ferrymysql "github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/faultproxy"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

// stack is what every scenario shares: the broker server and the database
// server. Each scenario gets its own database (SQLite file or Postgres
// schema) and its own stream from it.
type stack struct {
	pgURL    string
	myURL    string // MySQL/MariaDB server (mysql.go); pgURL is then empty
	natsURL  string
	embedded *natsembed.Server
	cluster  *natsCluster // --broker nats-cluster (cluster.go)
	procs    *procCluster // nats-leader-sigkill: the scenario's cluster of node processes (nodeproc_linux.go)
	kfake    *kfakeStack  // kafka://kfake: prove's cluster and its brokers' proxies (startKfake)
	kafka    []string     // seed brokers
	amqpURL  string
	broker   string // "nats", or the scheme of an unsupported broker
	tmp      string
	// partitionInbox: Postgres databases get a partitioned inbox.
	partitionInbox time.Duration
}

func openStack(ctx context.Context, cfg *config) (*stack, error) {
	st := &stack{pgURL: cfg.postgresURL, myURL: cfg.mysqlURL, broker: "nats", partitionInbox: cfg.partitionInbox}
	tmp, err := os.MkdirTemp("", "ferry-prove-")
	if err != nil {
		return nil, fmt.Errorf("prove: temp dir: %w", err)
	}
	st.tmp = tmp
	switch {
	case cfg.brokerURL == "":
		e, err := startEmbeddedNATS(cfg.logger)
		if err != nil {
			st.close()
			return nil, err
		}
		st.embedded, st.natsURL = e, e.ClientURL()
	case cfg.brokerURL == BrokerNATSCluster:
		c, err := startNATSCluster()
		if err != nil {
			st.close()
			return nil, err
		}
		st.cluster, st.natsURL = c, c.c.ClientURL()
	case strings.HasPrefix(cfg.brokerURL, "nats://"):
		st.natsURL = cfg.brokerURL
	case cfg.brokerURL == "kafka://kfake":
		ks, err := startKfake()
		if err != nil {
			st.close()
			return nil, err
		}
		st.kfake, st.kafka, st.broker = ks, ks.c.ListenAddrs(), "kafka"
	case strings.HasPrefix(cfg.brokerURL, "kafka://"):
		st.kafka, st.broker = splitSeeds(cfg.brokerURL), "kafka"
	default:
		st.amqpURL, st.broker = cfg.brokerURL, "rabbitmq"
	}
	if st.pgURL != "" {
		db, err := sql.Open("pgx", st.pgURL)
		if err != nil {
			st.close()
			return nil, fmt.Errorf("prove: open postgres: %w", err)
		}
		err = db.PingContext(ctx)
		_ = db.Close()
		if err != nil {
			st.close()
			return nil, fmt.Errorf("prove: connect postgres: %w", err)
		}
	}
	if st.myURL != "" {
		if err := pingMySQL(ctx, st.myURL); err != nil {
			st.close()
			return nil, err
		}
	}
	return st, nil
}

func (st *stack) describe() string {
	db := "sqlite"
	switch {
	case st.pgURL != "":
		db = "postgres"
	case st.myURL != "":
		db = "mysql"
	}
	b := st.broker
	switch {
	case st.embedded != nil:
		b = "nats(embedded)"
	case st.cluster != nil:
		b = "nats(3-node cluster, R3)"
	case st.kfake != nil:
		b = "kafka(kfake)"
	}
	return db + "+" + b
}

func (st *stack) close() {
	if st.embedded != nil {
		_ = st.embedded.Close()
	}
	if st.cluster != nil {
		st.cluster.close()
	}
	if st.kfake != nil {
		st.kfake.close()
	}
	if st.tmp != "" {
		_ = os.RemoveAll(st.tmp)
	}
}

// database is one scenario's database.
type database struct {
	db       *sql.DB
	drv      *databasesql.Driver
	dialect  driver.Dialect
	url      string // for subprocess workers: sqlite:PATH, the schema's postgres URL or the database's mysql URL
	schema   string // Postgres: the schema; MySQL: the database
	adminURL string // Postgres: the URL without search_path; MySQL: the server URL
	drop     func()
	// migrate: options of the migration (WithPartitionedInbox).
	migrate []migrate.Option
}

const proveShards = 8

func (st *stack) newDatabase(ctx context.Context, name string) (*database, error) {
	suffix := randHex(4)
	if st.myURL != "" {
		return st.newMySQLDatabase(ctx, name)
	}
	if st.pgURL == "" {
		path := filepath.Join(st.tmp, name+"-"+suffix+".db")
		db, err := sqlite.Open(path)
		if err != nil {
			return nil, err
		}
		d := &database{db: db, drv: sqlite.New(db), dialect: driver.SQLite, url: "sqlite:" + path, drop: func() {}}
		return d, d.init(ctx)
	}
	schema := "ferry_prove_" + strings.ReplaceAll(name, "-", "_") + "_" + suffix
	if len(schema) > 40 {
		schema = "ferry_prove_" + suffix
	}
	admin, err := sql.Open("pgx", st.pgURL)
	if err != nil {
		return nil, fmt.Errorf("prove: open postgres: %w", err)
	}
	if _, err := admin.ExecContext(ctx, fmt.Sprintf(`CREATE SCHEMA %q`, schema)); err != nil {
		_ = admin.Close()
		return nil, fmt.Errorf("prove: create schema: %w", err)
	}
	u, err := url.Parse(st.pgURL)
	if err != nil {
		_ = admin.Close()
		return nil, fmt.Errorf("prove: postgres url: %w", err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		_ = admin.Close()
		return nil, fmt.Errorf("prove: open schema: %w", err)
	}
	db.SetMaxOpenConns(16)
	d := &database{db: db, drv: databasesql.New(db, driver.Postgres), dialect: driver.Postgres, url: u.String(), schema: schema, adminURL: st.pgURL}
	if st.partitionInbox > 0 {
		d.migrate = append(d.migrate, migrate.WithPartitionedInbox(st.partitionInbox))
	}
	d.drop = func() {
		_, _ = admin.ExecContext(context.Background(), fmt.Sprintf(`DROP SCHEMA %q CASCADE`, schema))
		_ = admin.Close()
	}
	return d, d.init(ctx)
}

func (d *database) init(ctx context.Context) error {
	if _, err := migrate.Up(ctx, d.drv, ferry.Tables{}, d.migrate...); err != nil {
		return fmt.Errorf("prove: migrate: %w", err)
	}
	return createProveSchema(ctx, d.drv.Executor(), proveShards)
}

func (d *database) writer(topics ferry.TopicTemplate) (*outbox.Writer[*sql.Tx], error) {
	return outbox.New(d.drv, outbox.WithShardCount(proveShards), outbox.WithTopicTemplate(topics))
}

// newTransport creates the scenario's destination on the stack's broker.
func (st *stack) newTransport(ctx context.Context, scenario string, cfg *config) (transport, error) {
	switch st.broker {
	case "kafka":
		// kfake: every partition on all of prove's brokers (kfake keeps
		// one log per partition; the replicas are what metadata reports).
		replicas := int16(1)
		if st.kfake != nil {
			replicas = kfakeBrokers
		}
		t, err := newKafkaTransport(ctx, st.kafka, replicas, scenario)
		if t != nil {
			t.dynamic, t.proxied = cfg.kafkaDynamic, st.kfake != nil
		}
		return t, err
	case "rabbitmq":
		return newRabbitTransport(ctx, st.amqpURL, scenario)
	}
	s := &natsStream{url: st.natsURL, name: "PROVE_" + strings.ToUpper(strings.ReplaceAll(scenario, "-", "_")) + "_" + randHex(4), ackWait: cfg.ackWait}
	create := s.create
	if st.cluster != nil {
		create = s.createReplicated
	}
	if st.cluster != nil && st.procs == nil {
		// The nodes can say who leads only in this process: a stack on
		// node processes (onProcCluster) keeps st.cluster but not its
		// streams.
		s.leaders = st.cluster.leaders
	}
	if err := create(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// onProcCluster is the stack with its broker replaced by the cluster of
// node processes pc (streams still at 3 replicas).
func (st *stack) onProcCluster(pc *procCluster) *stack {
	c := *st
	c.procs, c.natsURL = pc, pc.clientURL()
	return &c
}

// unsupported says why sc cannot run on the stack's broker ("" if it can).
func (st *stack) unsupported(sc *scenario) string {
	if st.cluster != nil && sc.outage {
		return "the outage proxy fronts one server's client port; on the cluster nats-leader-kill and nats-partition take its place"
	}
	switch st.broker {
	case "kafka":
		return (&kafkaTransport{proxied: st.kfake != nil}).unsupported(sc)
	case "rabbitmq":
		return (&rabbitTransport{}).unsupported(sc)
	}
	return ""
}

func (st *stack) kafkaDesc() string {
	if st.kfake != nil {
		return "kfake"
	}
	return "kafka"
}

func (d *database) close() {
	_ = d.db.Close()
	d.drop()
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// proxiedRelayDB gives the relays their own connection pool to the
// scenario's schema through a fault proxy in front of Postgres, and
// returns the proxy and a function closing both.
func (e *env) proxiedRelayDB() (*faultproxy.Proxy, func(), error) {
	u, err := url.Parse(e.db.url)
	if err != nil {
		return nil, nil, fmt.Errorf("prove: postgres url: %w", err)
	}
	proxy, err := faultproxy.New(u.Host)
	if err != nil {
		return nil, nil, err
	}
	if e.db.dialect == driver.MySQL {
		db, err := openMySQLProxied(e.db.url, proxy.Addr())
		if err != nil {
			_ = proxy.Close()
			return nil, nil, fmt.Errorf("prove: open proxied mysql: %w", err)
		}
		db.SetMaxOpenConns(8)
		db.SetConnMaxLifetime(2 * time.Second)
		e.relayDB = ferrymysql.New(db)
		return proxy, func() { _ = db.Close(); _ = proxy.Close() }, nil
	}
	u.Host = proxy.Addr()
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	db, err := sql.Open("pgx", u.String())
	if err != nil {
		_ = proxy.Close()
		return nil, nil, fmt.Errorf("prove: open proxied postgres: %w", err)
	}
	db.SetMaxOpenConns(8)
	db.SetConnMaxLifetime(2 * time.Second)
	e.relayDB = databasesql.New(db, driver.Postgres)
	return proxy, func() { _ = db.Close(); _ = proxy.Close() }, nil
}
