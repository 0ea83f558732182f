package prove

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/outbox"
)

// Fault flags planned per event from the seed, so the same seed injects
// the same faults at the same events whatever the timing.
const (
	faultRelayCrash  = 1 << iota // relay crashes after publishing a batch holding it, before marking
	faultAckLoss                 // consumer commits, then crashes before acking it
	faultReorder                 // consumer defers its first delivery (a gap downstream)
	faultEffectCrash             // effect worker crashes after provider success, before the ledger write
	faultInboxCrash              // non-atomic inbox crashes between claim and apply
	faultProducer                // naive producer crashes between commit and publish
)

// Special event kinds placed on aggregates of their own (a parked event
// holds its aggregate, by design, so it is the aggregate's only event).
const (
	specialNone = iota
	specialPoison
	specialSchema
	specialUnauthorized
)

type plannedEvent struct {
	id        string
	tenant    string
	aggregate string
	kind      string // order.created, order.line_added, order.paid, order.shipped, order.cancelled
	schema    int
	principal string
	special   int
	faults    int
	payload   []byte
}

type plannedTx struct {
	id       int
	producer int
	rollback bool
	events   []*plannedEvent
}

// plan is a scenario's workload, fully decided before anything runs.
type plan struct {
	txs    []*plannedTx
	events map[string]*plannedEvent
	canary []string

	// abandonOnError: a transaction that fails after BEGIN is given up,
	// not retried (planOptions.abandonOnError).
	abandonOnError bool
	txWork         time.Duration // planOptions.txWork
	// committing counts producers inside COMMIT right now (db-crash aims
	// its frozen crash at one).
	committing atomic.Int32
	// serverDown is set by an injector while the server it crashed is
	// down or restarting (db-crash): producers' retry budget does not run
	// then, however long crash recovery takes on a loaded machine — the
	// restart has its own limit, which fails the scenario by name.
	serverDown atomic.Bool
	// outcomes is what the producer saw of each transaction (the only
	// state the run adds to the plan).
	outcomes *txOutcomes
}

// Client-side outcomes of a producer transaction, as the producer saw them.
const (
	outcomeCommitted  = "committed"   // COMMIT returned success
	outcomeRolledBack = "rolled_back" // the planned rollback
	outcomeFailed     = "failed"      // an error before or at COMMIT with the server's answer: not committed
	outcomeUnknown    = "unknown"     // the connection died during COMMIT: committed or not, the client cannot tell
)

// txOutcomes records, per planned transaction, the outcome its producer
// saw last. The checker holds the database to it (checkOutcomes).
type txOutcomes struct {
	mu sync.Mutex
	tx map[int]string
}

func (o *txOutcomes) set(tx int, outcome string) {
	if o == nil {
		return // a worker subprocess's plan records nothing
	}
	o.mu.Lock()
	o.tx[tx] = outcome
	o.mu.Unlock()
}

// snapshot returns a copy of the outcomes recorded so far.
func (o *txOutcomes) snapshot() map[int]string {
	if o == nil {
		return nil
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	m := make(map[int]string, len(o.tx))
	for k, v := range o.tx {
		m[k] = v
	}
	return m
}

func (o *txOutcomes) count() int {
	if o == nil {
		return 0
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.tx)
}

// planOptions are the scenario's knobs for the generator.
type planOptions struct {
	rollbackRate float64
	faultRates   map[int]float64
	specials     map[int]int // special kind -> count of dedicated aggregates
	race         bool        // a few aggregates written by every producer at once
	// abandonOnError: a transaction that fails after BEGIN (a statement or
	// COMMIT answered with an error, or the connection died) is recorded
	// as failed (or unknown) and given up instead of retried, so the
	// checker can hold the database to what the client was told
	// (db-crash). BEGIN failures are retried either way.
	abandonOnError bool
	// txWork is a pause inside each transaction, after its writes and
	// before COMMIT (the rest of a real transaction's work): a crash then
	// finds transactions open and COMMITs in flight (db-crash).
	txWork time.Duration
}

func seedFor(seed int64, scenario string) (uint64, uint64) {
	h := fnv.New64a()
	_, _ = h.Write([]byte(scenario))
	return uint64(seed), h.Sum64()
}

// newPlan generates the order flow: per aggregate, create (sometimes with
// a second event in the same transaction), pay, then ship or cancel;
// repeated until the event budget is spent. Rolled-back transactions are
// planned too; every payload carries a canary string that must never leak.
func newPlan(cfg *config, scenario string, o planOptions) (*plan, error) {
	s1, s2 := seedFor(cfg.seed, scenario)
	rng := rand.New(rand.NewPCG(s1, s2))
	p := &plan{events: map[string]*plannedEvent{}, abandonOnError: o.abandonOnError, txWork: o.txWork, outcomes: &txOutcomes{tx: map[int]string{}}}
	tenants := make([]string, cfg.tenants)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("tenant-%02d", i)
	}
	aggs := cfg.aggregates
	if o.race {
		aggs = max(1, min(3, aggs))
	}
	type aggState struct {
		tenant, id string
		step       int
	}
	var states []*aggState
	for _, t := range tenants {
		for a := 0; a < aggs; a++ {
			// Same ids in every tenant: the tenant id must keep them apart.
			states = append(states, &aggState{tenant: t, id: fmt.Sprintf("o-%05d", a)})
		}
	}
	newEvent := func(st *aggState, kind string) (*plannedEvent, error) {
		id, err := ferry.NewEventID()
		if err != nil {
			return nil, err
		}
		canary := fmt.Sprintf("CANARY-%016x", rng.Uint64())
		p.canary = append(p.canary, canary)
		ev := &plannedEvent{id: id.String(), tenant: st.tenant, aggregate: st.id, kind: kind, schema: 1,
			principal: "user:clerk"}
		for f, r := range o.faultRates {
			if rng.Float64() < r {
				ev.faults |= f
			}
		}
		ev.payload = fmt.Appendf(nil, `{"order":%q,"amount_cents":%d,"card_note":%q}`, st.id, 100+rng.IntN(100000), canary)
		return ev, nil
	}
	planned := 0
	txid := 0
	for planned < cfg.events {
		st := states[rng.IntN(len(states))]
		var kinds []string
		switch st.step % 3 {
		case 0:
			kinds = []string{"order.created"}
			if rng.IntN(2) == 0 {
				kinds = append(kinds, "order.line_added") // multi-event transaction
			}
		case 1:
			kinds = []string{"order.paid"}
		case 2:
			if rng.IntN(4) == 0 {
				kinds = []string{"order.cancelled"}
			} else {
				kinds = []string{"order.shipped"}
			}
		}
		tx := &plannedTx{id: txid, rollback: rng.Float64() < o.rollbackRate}
		txid++
		if o.race {
			tx.producer = rng.IntN(cfg.producers)
		} else {
			h := fnv.New32a()
			_, _ = h.Write([]byte(st.tenant + "/" + st.id))
			tx.producer = int(h.Sum32() % uint32(cfg.producers))
		}
		for _, k := range kinds {
			ev, err := newEvent(st, k)
			if err != nil {
				return nil, err
			}
			tx.events = append(tx.events, ev)
		}
		if !tx.rollback {
			st.step++
		}
		planned += len(kinds)
		p.txs = append(p.txs, tx)
	}
	// Dedicated aggregates for events that must be parked, never applied.
	for kind := specialPoison; kind <= specialUnauthorized; kind++ {
		for i := 0; i < o.specials[kind]; i++ {
			st := &aggState{tenant: tenants[i%len(tenants)], id: fmt.Sprintf("special-%d-%03d", kind, i)}
			ev, err := newEvent(st, "order.created")
			if err != nil {
				return nil, err
			}
			ev.special = kind
			ev.faults = 0
			switch kind {
			case specialPoison:
				ev.payload = append(ev.payload[:len(ev.payload)-1], []byte(`,"poison":true}`)...)
			case specialSchema:
				ev.schema = 3
			case specialUnauthorized:
				ev.principal = "user:mallory"
			}
			tx := &plannedTx{id: txid, producer: txid % cfg.producers, events: []*plannedEvent{ev}}
			txid++
			p.txs = append(p.txs, tx)
		}
	}
	for _, tx := range p.txs {
		for _, ev := range tx.events {
			p.events[ev.id] = ev
		}
	}
	return p, nil
}

func (e *plannedEvent) event() ferry.Event {
	id, _ := parseUUID(e.id)
	return ferry.Event{ID: id, TenantID: e.tenant, AggregateType: "order", AggregateID: e.aggregate,
		EventType: e.kind, SchemaVersion: e.schema, Payload: e.payload,
		Headers: ferry.Headers{Principal: e.principal, Action: strings.TrimPrefix(e.kind, "order."), Target: "order/" + e.aggregate,
			CorrelationID: "corr-" + e.aggregate}}
}

// produce runs the plan's transactions on cfg.producers goroutines. Each
// transaction writes business rows and its events in one local
// transaction and commits or deliberately rolls back.
func produce(ctx context.Context, db *database, w *outbox.Writer[*sql.Tx], p *plan, producers int, onTx func()) error {
	return eachProducer(p, producers, func(tx *plannedTx) error {
		if err := runTx(ctx, db, w, p, tx); err != nil {
			return err
		}
		if onTx != nil {
			onTx()
		}
		return nil
	})
}

// eachProducer runs run for each of the plan's transactions, those of one
// producer in order on that producer's goroutine; a producer stops at
// its first error. It returns when every producer has stopped.
func eachProducer(p *plan, producers int, run func(*plannedTx) error) error {
	byProducer := make([][]*plannedTx, producers)
	for _, tx := range p.txs {
		byProducer[tx.producer] = append(byProducer[tx.producer], tx)
	}
	var wg sync.WaitGroup
	errs := make([]error, producers)
	for i := range byProducer {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, tx := range byProducer[i] {
				if err := run(tx); err != nil {
					errs[i] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// producerRetryBudget is how long a producer keeps retrying one
// transaction that fails (at least 20 attempts), not counting the time an
// injector holds the server down (plan.serverDown).
const producerRetryBudget = 30 * time.Second

func runTx(ctx context.Context, db *database, w *outbox.Writer[*sql.Tx], p *plan, ptx *plannedTx) error {
	var err error
	start := time.Now()
	for attempt := 0; attempt < 20 || time.Since(start) < producerRetryBudget; attempt++ {
		var out string
		out, err = runTxOnceCounting(ctx, db, ptx, &p.committing, func(tx *sql.Tx, events []ferry.Event) error {
			if _, err := w.InsertTx(ctx, tx, events...); err != nil {
				return err
			}
			if p.txWork > 0 {
				time.Sleep(p.txWork)
			}
			return nil
		})
		switch {
		case err == nil:
			p.outcomes.set(ptx.id, out)
			return nil
		case out == outcomeUnknown:
			// Never retried: a retry of a transaction that did commit
			// would only fail on its own rows; the checker decides.
			p.outcomes.set(ptx.id, out)
			return nil
		case ctx.Err() != nil:
			return err
		case out == outcomeFailed && p.abandonOnError:
			p.outcomes.set(ptx.id, out)
			return nil
		}
		// Serialization failures and busy databases: retry the whole
		// transaction; event ids stay the same, as a retried command's would.
		time.Sleep(min(time.Duration(attempt+1)*5*time.Millisecond, 200*time.Millisecond))
		if p.serverDown.Load() {
			start = time.Now()
		}
	}
	p.outcomes.set(ptx.id, outcomeFailed)
	return fmt.Errorf("prove: producer tx %d: gave up after %s: %w", ptx.id, time.Since(start).Round(time.Millisecond), err)
}

var errPlannedRollback = errors.New("prove: planned rollback")

// runTxOnce writes the business rows, calls write for the events, and
// commits or rolls back as planned. It returns the outcome the client
// saw: "" when BEGIN failed (nothing was attempted), outcomeFailed when a
// statement failed or COMMIT was answered with an error, outcomeUnknown
// when COMMIT's answer was lost (commitOutcomeLost).
func runTxOnce(ctx context.Context, db *database, ptx *plannedTx, write func(*sql.Tx, []ferry.Event) error) (string, error) {
	return runTxOnceCounting(ctx, db, ptx, nil, write)
}

// runTxOnceCounting is runTxOnce counting itself in committing (if not
// nil) while its COMMIT is under way.
func runTxOnceCounting(ctx context.Context, db *database, ptx *plannedTx, committing *atomic.Int32, write func(*sql.Tx, []ferry.Event) error) (string, error) {
	tx, err := db.db.BeginTx(ctx, nil)
	if err != nil {
		return "", fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	events := make([]ferry.Event, len(ptx.events))
	for i, ev := range ptx.events {
		if _, err := tx.ExecContext(ctx, rawSQL(db.dialect, `INSERT INTO prove_business (event_id, tx_id, tenant_id, order_id, kind) VALUES ($1, $2, $3, $4, $5)`),
			ev.id, ptx.id, ev.tenant, ev.aggregate, ev.kind); err != nil {
			return outcomeFailed, fmt.Errorf("business row: %w", err)
		}
		events[i] = ev.event()
	}
	if err := write(tx, events); err != nil {
		return outcomeFailed, err
	}
	if ptx.rollback {
		if err := tx.Rollback(); err != nil {
			return outcomeFailed, err
		}
		return outcomeRolledBack, nil
	}
	if committing != nil {
		committing.Add(1)
		defer committing.Add(-1)
	}
	if err := tx.Commit(); err != nil {
		if commitOutcomeLost(db, err) {
			return outcomeUnknown, fmt.Errorf("commit: %w", err)
		}
		return outcomeFailed, fmt.Errorf("commit: %w", err)
	}
	return outcomeCommitted, nil
}

// commitOutcomeLost reports whether a COMMIT error leaves the outcome
// unknown: the server's answer never arrived (the connection reset or
// closed, a timeout) rather than an answer saying it failed. pgx's
// "safe to retry" is not trusted: a run where it was taken for "not
// committed" showed committed transactions (pgx reports "conn closed" for
// a COMMIT whose connection was reset while it waited). SQLite is a
// library call: its errors are answers.
func commitOutcomeLost(db *database, err error) bool {
	if db.dialect == driver.SQLite {
		return false
	}
	var pgErr *pgconn.PgError
	var myErr *mysql.MySQLError
	return !errors.As(err, &pgErr) && !errors.As(err, &myErr)
}
