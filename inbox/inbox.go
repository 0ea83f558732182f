package inbox

import (
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"regexp"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/logattr"
)

// Inbox is one named consumer: it applies events through a [Handler] in the
// consumer's own transaction, exactly once in effect per (consumer, tenant,
// event id), in per-aggregate order, and parks what it cannot apply.
//
// Run feeds it from a broker; ListParked, GetParked, Replay, DryRun and
// ReleaseGap are the operator's API over what it parked. An Inbox is safe
// for concurrent use; run at most one Run per Inbox value (several
// processes, or several Inbox values with the same name, may share one
// consumer name: the claim and the cursor lock keep them consistent).
type Inbox[TTx any] struct {
	drv     driver.Driver[TTx]
	name    string
	handler Handler[TTx]
	cfg     config
	// authorize is cfg.authorize with its type checked by New.
	authorize Authorizer[TTx]
	q         *queries
	log       *slog.Logger
	m         *metrics

	attempts attemptTracker
	running  atomic.Pointer[broker.Consumer] // for the lag gauge
	stats    counters
}

var consumerNameRE = regexp.MustCompile(`^[A-Za-z0-9_\-]+([.:][A-Za-z0-9_\-]+)*$`)

// MaxConsumerNameBytes bounds a consumer name (it is part of every key).
const MaxConsumerNameBytes = 128

// New returns the inbox of consumer name over drv. The name is the dedup
// and cursor scope: two deployments of the same service share it; two
// different services must not. The inbox tables come from migration 0003
// (`ferry migrate up`).
func New[TTx any](drv driver.Driver[TTx], name string, handler Handler[TTx], opts ...Option) (*Inbox[TTx], error) {
	if drv == nil {
		return nil, &ferry.ConfigError{Field: "inbox.driver", Reason: "must not be nil"}
	}
	if handler == nil {
		return nil, &ferry.ConfigError{Field: "inbox.handler", Reason: "must not be nil"}
	}
	if name == "" || len(name) > MaxConsumerNameBytes || !consumerNameRE.MatchString(name) {
		return nil, &ferry.ConfigError{Field: "inbox.consumer", Reason: fmt.Sprintf("must be 1..%d bytes of A-Z a-z 0-9 _ - with single . or : between them", MaxConsumerNameBytes)}
	}
	cfg := config{
		ordering:       true,
		workers:        8,
		queue:          64,
		batch:          1,
		maxAttempts:    5,
		backoffBase:    200 * time.Millisecond,
		backoffMax:     30 * time.Second,
		gapAlert:       5 * time.Minute,
		healInterval:   5 * time.Second,
		drainTimeout:   10 * time.Second,
		partitionEvery: DefaultPartitionMaintenance,
		maxRawBytes:    64 << 10,
		now:            time.Now,
	}
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	var authorize Authorizer[TTx]
	if cfg.authorize != nil {
		a, ok := cfg.authorize.(Authorizer[TTx])
		if !ok {
			return nil, &ferry.ConfigError{Field: "inbox.authorizer", Reason: fmt.Sprintf("is an %T, but the driver's transaction type needs an inbox.Authorizer[%s]", cfg.authorize, reflect.TypeFor[TTx]())}
		}
		authorize = a
	}
	if cfg.tracer == nil {
		cfg.tracer = otel.GetTracerProvider().Tracer(tracerName)
	}
	q, err := newQueries(drv.Dialect(), cfg.tables)
	if err != nil {
		return nil, err
	}
	log := logattr.OrDefault(cfg.logger)
	ib := &Inbox[TTx]{drv: drv, name: name, handler: handler, cfg: cfg, authorize: authorize, q: q,
		log: log.With("consumer", name), attempts: attemptTracker{m: map[string]int{}}}
	ib.m, err = newMetrics(name, cfg.registerer, ib.collectGauges)
	if err != nil {
		return nil, err
	}
	ib.checkPool(drv)
	return ib, nil
}

// Name returns the consumer name.
func (ib *Inbox[TTx]) Name() string { return ib.name }

// Stats are this process's counts since New (the metrics carry the same).
type Stats struct {
	Applied, Duplicates, Stale, Collisions, Retries int64
	// Parked counts park events by reason (a redelivered parked message
	// counts again).
	Parked map[Reason]int64
}

type counters struct {
	applied, duplicates, stale, collisions, retries atomic.Int64
	parked                                          [numReasons]atomic.Int64
}

// Stats returns the counts of this Inbox value.
func (ib *Inbox[TTx]) Stats() Stats {
	s := Stats{Applied: ib.stats.applied.Load(), Duplicates: ib.stats.duplicates.Load(), Stale: ib.stats.stale.Load(),
		Collisions: ib.stats.collisions.Load(), Retries: ib.stats.retries.Load(), Parked: map[Reason]int64{}}
	for i, r := range allReasons {
		if n := ib.stats.parked[i].Load(); n > 0 {
			s.Parked[r] = n
		}
	}
	return s
}

// Reason says why a message was parked.
type Reason string

// The park reasons.
const (
	ReasonGap          Reason = "gap"          // an earlier event of the aggregate has not been applied
	ReasonSchema       Reason = "schema"       // (event type, schema version) not supported
	ReasonUnauthorized Reason = "unauthorized" // the authorization hook denied it
	ReasonPoison       Reason = "poison"       // permanent handler error or too many attempts
	ReasonCollision    Reason = "collision"    // same (tenant, event id), different content
	ReasonUndecodable  Reason = "undecodable"  // not a valid Ferry event
	ReasonDecrypt      Reason = "decrypt"      // the payload does not decrypt (WithDecryption): wrong, missing or erased key
	ReasonClaimCheck   Reason = "claimcheck"   // the offloaded payload is missing or fails its size/digest check (WithClaimCheck)
)

var allReasons = [...]Reason{ReasonGap, ReasonSchema, ReasonUnauthorized, ReasonPoison, ReasonCollision, ReasonUndecodable, ReasonDecrypt, ReasonClaimCheck}

const numReasons = len(allReasons)

func reasonIndex(r Reason) int {
	for i, x := range allReasons {
		if x == r {
			return i
		}
	}
	return -1
}

// Outcome is what the inbox did (or, in a dry run, would do) with a message.
type Outcome string

// The outcomes.
const (
	OutcomeApplied   Outcome = "applied"   // the handler's effect committed with the claim
	OutcomeDuplicate Outcome = "duplicate" // already applied: no effect
	OutcomeStale     Outcome = "stale"     // the cursor is already past it: no effect
	OutcomeParked    Outcome = "parked"    // kept for an operator; see Reason
	OutcomeRetry     Outcome = "retry"     // rolled back; will be redelivered
)

// attemptTracker counts failures per event for brokers that do not report
// a delivery count. Bounded: it forgets everything when it grows too big,
// which only delays poison detection.
type attemptTracker struct {
	mu sync.Mutex
	m  map[string]int
}

const maxTrackedAttempts = 100000

func (a *attemptTracker) inc(key string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.m) >= maxTrackedAttempts {
		clear(a.m)
	}
	a.m[key]++
	return a.m[key]
}

func (a *attemptTracker) forget(key string) {
	a.mu.Lock()
	delete(a.m, key)
	a.mu.Unlock()
}

var errConcurrent = errors.New("inbox: concurrent claim or cursor move; retry")
