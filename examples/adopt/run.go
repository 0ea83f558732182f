package adopt

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/examples/adopt/legacy"
	"github.com/ferryhq/ferry/relay"
	"github.com/ferryhq/ferry/shadow"
)

// Streams of the example: the old path publishes to Stream (legacy.Subject),
// the relay in shadow mode to ShadowStream (ShadowPrefix + legacy.Subject).
const (
	Stream       = "ORDERS"
	ShadowStream = "SHADOW_ORDERS"
	ShadowPrefix = "shadow."
)

// Config is one side-by-side run.
type Config struct {
	Dir          string       // SQLite files and the embedded NATS store; required
	Orders       int          // orders placed on both paths, 1..100000
	CutRate      float64      // share of orders whose old-path publish is cut after commit, 0..1
	Seed         uint64       // seeds the cut decisions
	RelayCrashes int          // relay batches that crash after publish, before mark, 0..100
	Logger       *slog.Logger // the relay's logger; nil: discarded
}

func (c Config) validate() error {
	switch {
	case c.Dir == "":
		return errors.New("adopt: Config.Dir is required")
	case c.Orders < 1 || c.Orders > 100_000:
		return fmt.Errorf("adopt: Config.Orders must be in 1..100000, got %d", c.Orders)
	case !(c.CutRate >= 0 && c.CutRate <= 1):
		return fmt.Errorf("adopt: Config.CutRate must be in 0..1, got %v", c.CutRate)
	case c.RelayCrashes < 0 || c.RelayCrashes > 100:
		return fmt.Errorf("adopt: Config.RelayCrashes must be in 0..100, got %d", c.RelayCrashes)
	}
	return nil
}

// Result is what a run observed.
type Result struct {
	Orders       int
	Cut          []string // order ids whose old-path publish was cut, in order
	OldStored    int      // order rows in the old service's database
	NewStored    int      // order rows in the fixed service's database
	RelayCrashes int      // relay runs that ended in the injected crash
	Delivered    int      // distinct order ids on the shadow stream: what the outbox path delivered
	Report       *shadow.Report
}

// Run places cfg.Orders orders on the legacy and the fixed service side by
// side on one embedded JetStream server, cuts the legacy publish after
// commit for a seeded cfg.CutRate share, crashes the shadow-mode relay
// cfg.RelayCrashes times between publish and mark (restarting it each
// time), and compares the production stream with the shadow stream by
// order_id.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	emb, err := natsembed.Start(natsembed.WithStoreDir(filepath.Join(cfg.Dir, "nats")))
	if err != nil {
		return nil, fmt.Errorf("adopt: nats: %w", err)
	}
	defer func() { _ = emb.Close() }()
	nc, err := natsjs.Connect(emb.ClientURL())
	if err != nil {
		return nil, fmt.Errorf("adopt: connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("adopt: jetstream: %w", err)
	}
	for name, subj := range map[string]string{Stream: legacy.Subject, ShadowStream: ShadowPrefix + legacy.Subject} {
		if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: name, Subjects: []string{subj}}); err != nil {
			return nil, fmt.Errorf("adopt: stream %s: %w", name, err)
		}
	}

	oldDB, err := sqlite.Open(filepath.Join(cfg.Dir, "legacy.db"))
	if err != nil {
		return nil, fmt.Errorf("adopt: legacy db: %w", err)
	}
	defer func() { _ = oldDB.Close() }()
	if _, err := oldDB.ExecContext(ctx, legacy.Schema); err != nil {
		return nil, fmt.Errorf("adopt: legacy schema: %w", err)
	}
	fixed, err := Open(ctx, filepath.Join(cfg.Dir, "adopt.db"))
	if err != nil {
		return nil, err
	}
	defer func() { _ = fixed.Close() }()

	// The fault the dual write loses to: the process dies between the
	// commit and the publish. The same orders are cut on both paths.
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x9e3779b97f4a7c15))
	cut := map[string]bool{}
	errCut := errors.New("process died after commit (injected)")
	hook := func(id string) error {
		if cut[id] {
			return errCut
		}
		return nil
	}
	old := &legacy.Service{DB: oldDB, JS: js, AfterCommit: hook}
	fixed.AfterCommit = hook

	pub, err := natsjs.NewPublisher(nc)
	if err != nil {
		return nil, fmt.Errorf("adopt: publisher: %w", err)
	}
	defer func() { _ = pub.Close() }()
	sp, err := shadow.NewPublisher(pub, ShadowPrefix)
	if err != nil {
		return nil, fmt.Errorf("adopt: shadow publisher: %w", err)
	}
	var mu sync.Mutex
	crashes := 0
	crash := func(_ context.Context, _ []ferry.Event, res []broker.Result) error {
		for _, r := range res {
			if r.Err != nil {
				return nil
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if crashes >= cfg.RelayCrashes {
			return nil
		}
		crashes++
		return errors.New("relay died after publish, before mark (injected)")
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	relayDone := make(chan error, 1)
	go func() {
		for {
			r, err := relay.New(fixed.Driver, sp, relay.WithInstanceID("adopt-relay"), relay.WithShardCount(Shards), relay.WithBatchSize(20),
				relay.WithPollInterval(20*time.Millisecond), relay.WithRegisterer(prometheus.NewRegistry()),
				relay.WithLogger(logger), relay.WithFaults(relay.Faults{AfterPublishBeforeMark: crash}))
			if err != nil {
				relayDone <- err
				return
			}
			err = r.Run(relayCtx)
			if errors.Is(err, relay.ErrFaultInjected) && relayCtx.Err() == nil {
				continue // restarted under the same instance id, as a supervisor would
			}
			relayDone <- err
			return
		}
	}()

	res := &Result{Orders: cfg.Orders}
	for i := 1; i <= cfg.Orders; i++ {
		o := legacy.Order{ID: fmt.Sprintf("o-%05d", i), Customer: fmt.Sprintf("c-%d", i%17), TotalCents: int64(100 + i)}
		if rng.Float64() < cfg.CutRate {
			cut[o.ID] = true
			res.Cut = append(res.Cut, o.ID)
		}
		if err := old.PlaceOrder(ctx, o); err != nil && !errors.Is(err, errCut) {
			return nil, err
		}
		if err := fixed.PlaceOrder(ctx, o); err != nil && !errors.Is(err, errCut) {
			return nil, err
		}
	}
	if err := waitSent(ctx, fixed.DB, cfg.Orders); err != nil {
		return nil, err
	}
	stopRelay()
	if err := <-relayDone; err != nil && !errors.Is(err, context.Canceled) {
		return nil, fmt.Errorf("adopt: relay: %w", err)
	}
	res.RelayCrashes = crashes
	for db, n := range map[*sql.DB]*int{oldDB: &res.OldStored, fixed.DB: &res.NewStored} {
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM orders`).Scan(n); err != nil {
			return nil, fmt.Errorf("adopt: count orders: %w", err)
		}
	}

	prod, err := shadow.ReadNATS(ctx, js, Stream, "", time.Time{})
	if err != nil {
		return nil, err
	}
	sh, err := shadow.ReadNATS(ctx, js, ShadowStream, ShadowPrefix+legacy.Subject, time.Time{})
	if err != nil {
		return nil, err
	}
	key, err := shadow.ParseKey("json:/order_id")
	if err != nil {
		return nil, err
	}
	res.Report = shadow.Compare(prod, sh, key)
	seen := map[string]bool{}
	for _, m := range sh {
		if k, err := key.Of(m); err == nil {
			seen[k] = true
		}
	}
	res.Delivered = len(seen)
	return res, nil
}

func waitSent(ctx context.Context, db *sql.DB, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for {
		var sent int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM ferry_outbox WHERE status = 'sent'`).Scan(&sent); err != nil {
			return fmt.Errorf("adopt: wait for the relay (%d rows): %w", n, err)
		}
		if sent == n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("adopt: the relay marked %d of %d rows sent: %w", sent, n, ctx.Err())
		case <-t.C:
		}
	}
}

// Figure is the run's outcome in a few lines.
func Figure(r *Result) string {
	rep := r.Report
	return fmt.Sprintf("orders: %d stored by the old path, %d by the outbox path (of %d)\n"+
		"old dual write lost %d of %d events (cut between commit and publish: %d)\n"+
		"outbox lost %d of %d (relay crashed %d times between publish and mark; duplicates on the shadow stream: %d, the replays carry the event id as Nats-Msg-Id)\n"+
		"shadow compare: missing %d, extra %d, differing %d, reordered %d\n",
		r.OldStored, r.NewStored, r.Orders,
		len(rep.Missing), r.Orders, len(r.Cut),
		r.Orders-r.Delivered, r.Orders, r.RelayCrashes, rep.Shadow-r.Delivered,
		len(rep.Missing), len(rep.Extra), len(rep.Differing), len(rep.Reordered))
}
