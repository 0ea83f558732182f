package prove

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" database/sql driver
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/databasesql"
	ferrymysql "github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/relay"
)

// WorkerEnv names the environment variable that turns a process into a
// prove worker: its value is the job, as JSON. The parent sets it when it
// starts a worker subprocess; nothing else should.
const WorkerEnv = "FERRY_PROVE_WORKER"

// ErrNotWorker is returned by RunWorker in a process that was not started
// as a worker.
var ErrNotWorker = errors.New("prove: not started as a worker (" + WorkerEnv + " unset)")

type workerJob struct {
	Role        string       `json:"role"` // "relay", "cdc", "inbox", "effects" or "nats-node"
	DatabaseURL string       `json:"database_url"`
	Transport   transportJob `json:"transport"`
	ID          string       `json:"id"`
	Reference   bool         `json:"reference,omitempty"`
	// SentWatermark: role "relay" — the watermark design (WithSentWatermark).
	SentWatermark bool `json:"sent_watermark,omitempty"`
	// ShardPipeline: role "relay" — relay.WithShardPipeline (0: off).
	ShardPipeline int `json:"shard_pipeline,omitempty"`
	// StopOnce: freeze the whole process (SIGSTOP to itself) before the
	// first publish; the parent resumes it after the lease expired.
	StopOnce bool `json:"stop_once,omitempty"`
	// ProviderURL: the parent's fake provider over HTTP (role "effects").
	ProviderURL string `json:"provider_url,omitempty"`
	// Broken: a safety mechanism switched off in the worker (tests of the
	// checker; see withBrokenBuild).
	Broken string `json:"broken,omitempty"`
	// StartDelay: the inbox waits this long before consuming (tests of the
	// settle logic; see withSlowConsumer).
	StartDelay time.Duration `json:"start_delay,omitempty"`
	// Schema: role "cdc" — the outbox schema, also its slot's and
	// publication's name; DatabaseURL is then the admin URL.
	Schema string `json:"schema,omitempty"`
	// StatusFile: the worker rewrites this file with its pid and goroutine
	// count every StatusEvery (the soak's process figures, soak.go).
	StatusFile  string        `json:"status_file,omitempty"`
	StatusEvery time.Duration `json:"status_every,omitempty"`
	// Node: role "nats-node" — one node of prove's JetStream cluster run
	// as a process of its own (nodeproc.go), as natsembed planned it.
	Node *natsembed.NodeConfig `json:"node,omitempty"`
}

// workerReport is what a worker prints on stdout when it ends by SIGTERM.
// The frozen relay of concurrent-relays also prints one as soon as the
// fence rejects its first mark, so the parent can wait for that.
type workerReport struct {
	Fenced uint64 `json:"fenced"`
	Paused bool   `json:"paused"`
	// PublishCalls and Published (rows the relay recorded as sent) are its
	// relay.Status counters, reported so a relay that resumed but whose
	// mark was not fenced says how far it got.
	Published    uint64 `json:"published"`
	PublishCalls uint64 `json:"publish_calls"`
}

// IsWorker reports whether this process was started as a prove worker.
// A test binary's TestMain (or a main) calls RunWorker when it is.
func IsWorker() bool { return os.Getenv(WorkerEnv) != "" }

// RunWorker runs the job the parent put in WorkerEnv — a relay (package
// relay or the reference relay), package inbox's consumer, package
// effect's worker, or a node of prove's JetStream cluster — until ctx ends or the process is killed, which is the
// point: the parent SIGKILLs it at random moments and starts another.
func RunWorker(ctx context.Context) error {
	raw := os.Getenv(WorkerEnv)
	if raw == "" {
		return ErrNotWorker
	}
	var job workerJob
	if err := json.Unmarshal([]byte(raw), &job); err != nil {
		return fmt.Errorf("prove: worker job: %w", err)
	}
	switch job.Role {
	case "relay", "cdc", "inbox", "effects":
	case "nats-node":
		// A cluster node, SIGKILLed by the parent (nodeproc.go); no database.
		if job.Node == nil {
			return errors.New("prove: worker role nats-node without a node")
		}
		return natsembed.RunNode(ctx, *job.Node)
	default:
		return fmt.Errorf("prove: worker role %q: \"relay\", \"cdc\", \"inbox\", \"effects\" or \"nats-node\"", job.Role)
	}
	var db *sql.DB
	var dialect driver.Dialect
	var err error
	if path, ok := strings.CutPrefix(job.DatabaseURL, "sqlite:"); ok {
		db, err = sqlite.Open(path)
		dialect = driver.SQLite
	} else if isMySQLURL(job.DatabaseURL) {
		db, err = ferrymysql.Open(job.DatabaseURL)
		dialect = driver.MySQL
	} else {
		db, err = sql.Open("pgx", job.DatabaseURL)
		dialect = driver.Postgres
	}
	if err != nil {
		return fmt.Errorf("prove: worker database: %w", err)
	}
	defer db.Close()
	e := &env{db: &database{db: db, drv: databasesql.New(db, dialect), dialect: dialect, drop: func() {}},
		tr:   transportFromJob(job.Transport),
		plan: &plan{events: map[string]*plannedEvent{}}, log: slog.New(slog.DiscardHandler),
		rec: newRecorder(), reg: prometheus.NewRegistry(), sentWatermark: job.SentWatermark, shardPipeline: job.ShardPipeline}
	e.metrics = newMetrics(e.reg)
	if job.StatusFile != "" {
		go writeWorkerStatus(ctx, job.StatusFile, job.StatusEvery, e.rec)
	}
	if job.Role == "cdc" {
		// package relay/cdc, SIGKILLed by the parent (cdc.go).
		e.db.adminURL, e.db.schema = job.DatabaseURL, job.Schema
		return e.runCDC(ctx, job.Broken)
	}
	if job.Role == "effects" {
		// package effect's worker, calling the parent's provider over HTTP.
		return e.runHTTPEffects(ctx, job.ID, job.ProviderURL, job.Broken == "blind-retry")
	}
	if job.Role == "inbox" {
		// package inbox as the consumer; the effect intents it records are
		// executed by the parent's effect worker.
		sleepCtx(ctx, job.StartDelay)
		return e.runRealInbox(ctx, "prove", false, false)
	}
	if job.Reference {
		pub, err := e.newPublisher()
		if err != nil {
			return err
		}
		defer pub.Close()
		r := &refRelay{env: e, id: job.ID, pub: pub, ttl: relayTTL, held: map[int]int64{}}
		return r.run(ctx)
	}
	stop := &atomic.Bool{}
	stop.Store(job.StopOnce)
	var last relay.Status
	rf := relayFaults{stopOnce: stop}
	if job.StopOnce {
		var once sync.Once
		rf.status = func(st relay.Status) {
			last = st
			if st.Fenced > 0 {
				once.Do(func() { printWorkerReport(st, true) })
			}
		}
	}
	err = e.runRealRelay(ctx, job.ID, rf)
	last.Fenced = uint64(e.rec.fencedMarks.Load())
	printWorkerReport(last, job.StopOnce && !stop.Load())
	return err
}

func printWorkerReport(st relay.Status, paused bool) {
	rep, _ := json.Marshal(workerReport{Fenced: st.Fenced, Paused: paused, Published: st.Published, PublishCalls: st.PublishCall})
	fmt.Println(string(rep))
}

// frozenRelayReport returns the last report line in out that the frozen
// relay printed (Paused), if any.
func frozenRelayReport(out string) (workerReport, bool) {
	var rep, got workerReport
	ok := false
	for _, line := range strings.Split(out, "\n") {
		if json.Unmarshal([]byte(line), &rep) == nil && rep.Paused {
			got, ok = rep, true
		}
	}
	return got, ok
}

// sigkillKills is how many times a worker subprocess is killed.
const sigkillKills = 6

// startSigkill runs role ("relay" or "inbox") as a subprocess and SIGKILLs
// it sigkillKills times at seeded random moments, restarting it each time;
// the last one runs until the scenario ends. killsDone is closed after the
// last kill.
func startSigkill(ctx context.Context, wg *sync.WaitGroup, e *env, role string, killsDone chan<- struct{}) {
	s1, s2 := seedFor(e.cfg.seed, e.sc.name+"/sigkill")
	rng := rand.New(rand.NewPCG(s1, s2))
	job, _ := json.Marshal(workerJob{Role: role, DatabaseURL: e.db.url, Transport: e.tr.job(), Reference: e.cfg.referenceRelay, StartDelay: e.cfg.consumerDelay,
		SentWatermark: e.sentWatermark, ShardPipeline: e.shardPipeline})
	argv := e.cfg.worker
	wg.Add(1)
	go func() {
		defer wg.Done()
		kills := 0
		defer func() {
			if kills < sigkillKills {
				close(killsDone)
			}
		}()
		for i := 0; ctx.Err() == nil; i++ {
			j := strings.Replace(string(job), `"id":"",`, fmt.Sprintf(`"id":"%s-proc-%d",`, role, i), 1)
			cmd, exited, err := startWorkerProc(argv, j)
			if err != nil {
				e.rec.err(fmt.Errorf("prove: start worker: %w", err))
				sleepCtx(ctx, 200*time.Millisecond)
				continue
			}
			var timer <-chan time.Time
			if kills < sigkillKills {
				timer = time.After(150*time.Millisecond + time.Duration(rng.Int64N(int64(350*time.Millisecond))))
			}
			select {
			case <-ctx.Done():
			case <-exited:
				continue
			case <-timer:
				kills++
				e.faults.Add(1)
			}
			_ = cmd.Process.Kill() // SIGKILL: no deferred cleanup, no graceful anything
			<-exited
			if kills == sigkillKills && timer != nil {
				close(killsDone)
			}
		}
	}()
}

// startStoppingRelay runs one relay as a subprocess that freezes itself
// (SIGSTOP) before its first publish. Once it is frozen, started (the
// in-process relays) is closed; after 3 lease periods the process is
// resumed, publishes its stale batch and must be fenced when it marks. At
// the end it is asked to stop and reports its fenced writes.
func startStoppingRelay(ctx context.Context, wg *sync.WaitGroup, e *env, frozen, resumed chan<- struct{}) {
	job, _ := json.Marshal(workerJob{Role: "relay", DatabaseURL: e.db.url, Transport: e.tr.job(), ID: "relay-frozen", StopOnce: true,
		SentWatermark: e.sentWatermark, ShardPipeline: e.shardPipeline})
	argv := e.cfg.worker
	var out syncBuffer
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), WorkerEnv+"="+string(job))
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		e.rec.err(fmt.Errorf("prove: start worker: %w", err))
		close(frozen)
		close(resumed)
		return
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	wg.Add(1)
	go func() {
		defer wg.Done()
		once, once2 := sync.Once{}, sync.Once{}
		signal := func() { once.Do(func() { close(frozen) }) }
		woke := func() { once2.Do(func() { close(resumed) }) }
		defer signal()
		defer woke()
		for ctx.Err() == nil && !isStopped(cmd.Process.Pid) {
			select {
			case <-exited:
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
		if ctx.Err() == nil {
			e.faults.Add(1)
			signal()
			sleepCtx(ctx, 3*relayTTL)
		}
		resume(cmd.Process)
		// Let it publish its stale batch and try to mark: wait for its
		// report of the fenced mark, up to twice its publish timeout and
		// two lease periods more (a fixed two lease periods was once not
		// enough under CI's load, and the run moved on unfenced; once
		// the publish timeout and two lease periods, 12 s, with six prove
		// columns at once on two cores in CI 21).
		for deadline := time.Now().Add(2 * (relayPublishTimeout + 2*relayTTL)); ctx.Err() == nil && time.Now().Before(deadline); {
			if rep, ok := frozenRelayReport(out.String()); ok && rep.Fenced > 0 {
				break
			}
			sleepCtx(ctx, 50*time.Millisecond)
		}
		woke()
		<-ctx.Done()
		terminate(cmd.Process)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if rep, ok := frozenRelayReport(out.String()); ok {
			e.rec.fencedMarks.Add(int64(rep.Fenced))
			e.stoppedRelay.Store(true)
			e.frozenRelay = rep
		}
	}()
}

// startWorkerProc starts argv as a worker subprocess for job (WorkerEnv)
// and returns it with a channel closed once it has exited and been reaped.
// setup, if any, adjusts the command before it starts (output, process
// attributes).
func startWorkerProc(argv []string, job string, setup ...func(*exec.Cmd)) (*exec.Cmd, <-chan struct{}, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), WorkerEnv+"="+job)
	for _, f := range setup {
		f(cmd)
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	return cmd, exited, nil
}
