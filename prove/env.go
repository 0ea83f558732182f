package prove

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/driver/databasesql"
	"github.com/ferryhq/ferry/internal/faultproxy"
	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/ferryhq/ferry/internal/outboxstate"
	"github.com/ferryhq/ferry/outbox"
)

// errCrash is what a component returns when a planned fault "kills" it:
// it stops at once, leaving whatever it had not finished (unmarked rows,
// unacked messages, in-flight ledger rows) exactly as a dead process would.
var errCrash = errors.New("prove: injected crash")

// env is one scenario's running world.
type env struct {
	cfg      *config
	sc       *scenario
	st       *stack
	db       *database
	w        *outbox.Writer[*sql.Tx]
	tr       transport
	plan     *plan
	log      *slog.Logger
	reg      *prometheus.Registry
	metrics  *metrics
	logs     *syncBuffer
	rec      *recorder
	provider *fakeProvider
	prog     *progress

	// realInbox: package inbox consumes (else prove's reference inbox).
	realInbox bool
	// sentWatermark: package relay runs in the watermark design
	// (relay.WithSentWatermark) and every read of a row's state goes
	// through outboxStatus.
	sentWatermark bool
	// shardPipeline: package relay runs WithShardPipeline (0: off).
	shardPipeline int

	outboxSnap map[string]outboxTruth // outbox before a cleanup

	// earlyAcked counts messages the ack-before-commit control's inbox
	// has acked and not yet committed: its database crashes wait for one,
	// so the control's loss does not depend on the consumer keeping up.
	earlyAcked atomic.Int32

	relayDB      *databasesql.Driver // the relays' database when it differs (database-outage)
	stopping     bool                // a subprocess relay freezes itself (concurrent-relays)
	stoppedRelay atomic.Bool         // the frozen subprocess relay reported back
	frozenRelay  workerReport        // its last report (set before the scenario's wait group is done)
	settleWAL    string              // CDC scenarios: pg_current_wal_lsn() when settling began
	// cdcFirstDown is closed once the start-from-current-WAL control's
	// first relay is down; that control's workload waits for it after
	// cdcHoldAt transactions, so the rest commit while no relay streams
	// (what the broken restart skips) however slow the relay is to start.
	cdcFirstDown chan struct{}

	// pubVia is the host:port relays connect through (the fault proxy of
	// the outage scenario), or "" for direct.
	pubVia string
	// relayProxy is the fault proxy behind pubVia when a broker fault
	// (rabbitmq-connection-drop) drives it rather than the outage.
	relayProxy *faultproxy.Proxy
	// faultPubStart, faultPubEnd: publish calls made when a broker fault
	// began and ended, and faultPubInFlight those in flight when it began
	// (brokerfaults.go), under rec.mu.
	faultPubStart, faultPubEnd, faultPubInFlight int
	// faultFailStart: failed publish results when the fault began;
	// faultPubFailed: those that failed while it lasted (rabbitmq-node-kill).
	faultFailStart, faultPubFailed int64
	// rabbitNode: rabbitmq-node-kill's throwaway node (rabbitnode.go).
	rabbitNode *tempServer

	// effect-worker-sigkill: what each kill of the subprocess effect
	// worker left behind, and the scenario's summary for the report.
	effectKillsMu sync.Mutex
	effectKills   []effectKill
	extraNote     string

	// fault plan state: a planned fault fires once per event.
	fired  sync.Map // key fault/event id -> struct{}
	faults atomic.Int64
}

// fire reports whether the planned fault f for event id should fire now,
// at most once per (fault, event).
func (e *env) fire(f int, id string) bool {
	ev, ok := e.plan.events[id]
	if !ok || ev.faults&f == 0 {
		return false
	}
	if _, loaded := e.fired.LoadOrStore(fireKey{f, id}, struct{}{}); loaded {
		return false
	}
	e.faults.Add(1)
	return true
}

type fireKey struct {
	f  int
	id string
}

// recorder is prove's own instrumentation around the real broker client:
// every publish call and delivery is counted here, independently of what
// any component reports.
type recorder struct {
	mu          sync.Mutex
	pubCalls    map[string]int
	pubTotal    int
	deliveries  map[string]int
	firstAck    map[string]time.Time // first successful publish ack per event
	errs        []string
	fencedMarks atomic.Int64
	// pipelined: batches package relay claimed beside another batch of
	// their shard (relay.Status.Pipelined), in-process relays only.
	pipelined atomic.Int64
	// Publish results the broker adapter classified indeterminate (the
	// connection died before the confirm) and destination-missing (e.g.
	// the server closed the channel: no such exchange).
	pubIndeterminate, pubMissing atomic.Int64
	pubFailed                    atomic.Int64 // every publish result with an error
	pubInFlight                  int          // publish calls not returned yet, under mu
}

func newRecorder() *recorder {
	return &recorder{pubCalls: map[string]int{}, deliveries: map[string]int{}, firstAck: map[string]time.Time{}}
}

func (r *recorder) err(err error) {
	if err == nil {
		return
	}
	r.mu.Lock()
	r.errs = append(r.errs, err.Error())
	r.mu.Unlock()
}

// countingPublisher wraps a real publisher and counts calls per event id.
type countingPublisher struct {
	broker.Publisher
	rec *recorder
}

var _ broker.Publisher = (*countingPublisher)(nil)

func (c *countingPublisher) Publish(ctx context.Context, events []ferry.Event) []broker.Result {
	c.rec.mu.Lock()
	for _, e := range events {
		c.rec.pubCalls[e.ID.String()]++
		c.rec.pubTotal++
	}
	c.rec.pubInFlight++
	c.rec.mu.Unlock()
	res := c.Publisher.Publish(ctx, events)
	now := time.Now()
	c.rec.mu.Lock()
	c.rec.pubInFlight--
	for i, r := range res {
		if r.Err != nil {
			c.rec.errs = append(c.rec.errs, r.Err.Error())
			c.rec.pubFailed.Add(1)
			switch {
			case errors.Is(r.Err, broker.ErrDestinationMissing):
				c.rec.pubMissing.Add(1)
			case broker.ClassOf(r.Err) == broker.ClassIndeterminate:
				c.rec.pubIndeterminate.Add(1)
			}
			continue
		}
		if _, ok := c.rec.firstAck[events[i].ID.String()]; !ok {
			c.rec.firstAck[events[i].ID.String()] = now
		}
	}
	c.rec.mu.Unlock()
	return res
}

// newPublisher returns the broker adapter's publisher (Ferry's real
// code) for the scenario, wrapped to count calls.
func (e *env) newPublisher() (broker.Publisher, error) {
	p, err := e.tr.publisher(context.Background(), e.pubVia)
	if err != nil {
		return nil, err
	}
	return &countingPublisher{Publisher: p, rec: e.rec}, nil
}

// newConsumer returns the broker adapter's consumer for group.
func (e *env) newConsumer(ctx context.Context, group string) (broker.Consumer, error) {
	return e.tr.consumer(ctx, group)
}

// supervise runs a component, restarting it after a crash, until ctx ends.
func supervise(ctx context.Context, wg *sync.WaitGroup, log *slog.Logger, name string, run func(context.Context) error) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			err := run(ctx)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				log.DebugContext(ctx, "prove: component stopped, restarting", slog.String("component", name), logattr.Err(err))
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
}

// parkedTable is the ground-truth query of parked messages: event id,
// reason, resolved (healed or released), first seen in Unix nanoseconds.
func (e *env) parkedQuery() string {
	if e.realInbox {
		return sqlFor(e.db.dialect, `SELECT COALESCE(CAST(event_id AS TEXT), ''), reason, CASE WHEN resolved_at IS NULL THEN 0 ELSE 1 END, first_seen FROM ferry_inbox_parked`)
	}
	return `SELECT event_id, reason, healed_at, first_seen FROM prove_parked`
}

// openParkedSQL is the condition "event b.event_id is parked and unresolved
// for a reason other than a gap".
func (e *env) openParkedSQL() string {
	if e.realInbox {
		return sqlFor(e.db.dialect, `EXISTS (SELECT 1 FROM ferry_inbox_parked p WHERE CAST(p.event_id AS TEXT) = b.event_id AND p.resolved_at IS NULL AND p.reason <> 'gap')`)
	}
	return `EXISTS (SELECT 1 FROM prove_parked p WHERE p.event_id = b.event_id AND p.healed_at = 0 AND p.reason <> 'gap')`
}

// components names what a scenario ran, honestly.
func (e *env) components() []string {
	sc := e.sc
	c := []string{"ferry:outbox", "ferry:migrate", "ferry:broker/cloudevents"}
	switch e.tr.kind() {
	case "kafka":
		c = append(c, "ferry:broker/kafka", e.st.kafkaDesc())
	case "rabbitmq":
		c = append(c, "ferry:broker/rabbitmq", "rabbitmq")
		if sc.brokerFault == rabbitNodeKill {
			c[len(c)-1] = "rabbitmq(prove's throwaway node)"
		}
	default:
		if e.st.procs != nil {
			c = append(c, "ferry:broker/natsjs", "nats-server(jetstream, 3 node processes)")
		} else {
			c = append(c, "ferry:broker/natsjs", "nats-server(jetstream)")
		}
	}
	switch {
	case sc.naive:
		c = append(c, "prove:naive-producer")
	case sc.cdc:
		c = append(c, "ferry:relay/cdc")
	case e.cfg.referenceRelay:
		c = append(c, "prove:reference-relay")
	default:
		c = append(c, "ferry:relay")
	}
	if e.realInbox && sc.sigkillInbox {
		c = append(c, "ferry:inbox(subprocess)")
	} else if e.realInbox {
		c = append(c, "ferry:inbox")
	} else {
		c = append(c, "prove:reference-inbox")
	}
	if e.realInbox && sc.sigkillEffects {
		c = append(c, "ferry:effect(subprocess)", "ferry:effect/effecthttp")
	} else if e.realInbox {
		c = append(c, "ferry:effect")
	} else {
		c = append(c, "prove:reference-effect-ledger")
	}
	if sc.sigkillEffects {
		c = append(c, "prove:fake-provider(http)")
	} else {
		c = append(c, "prove:fake-provider")
	}
	if sc.outage || sc.dbOutage || sc.brokerFault == rabbitConnDrop || e.st.kfake != nil && sc.brokerFault == kafkaBrokerDown {
		c = append(c, "internal/faultproxy")
	}
	if sc.cleanup != "" && e.realInbox {
		c = append(c, "ferry:ops(cleanup)")
	}
	return c
}

// openEffectsSQL counts effect intents not yet finished.
func (e *env) openEffectsSQL() string {
	if e.realInbox {
		return `SELECT COUNT(*) FROM ferry_effects WHERE state NOT IN ('succeeded', 'failed')`
	}
	return `SELECT COUNT(*) FROM prove_ledger WHERE status <> 'succeeded'`
}

// outboxStatus is the SQL for the state of outbox row alias ("sent",
// "pending", "dead"): its status column, or — in the watermark design —
// the one definition the relay and ops read (internal/outboxstate: pending
// at or below its shard's watermark is sent, retry is pending).
func (e *env) outboxStatus(alias string) string {
	if !e.sentWatermark {
		return alias + ".status"
	}
	return outboxstate.Expr(ferry.Tables{}, alias)
}
