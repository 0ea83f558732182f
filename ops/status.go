package ops

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/ferryhq/ferry/driver"
)

// Status is a snapshot of every Ferry table an operator watches, read from
// the database alone, so it is true whether or not a relay or consumer is
// running (a stopped relay is exactly when it matters).
type Status struct {
	At     time.Time     `json:"at"`
	Window Window        `json:"replay_window"`
	Outbox OutboxTotals  `json:"outbox"`
	Topics []TopicStatus `json:"topics"`
	Shards []ShardStatus `json:"shards"`
	Relays []RelayStatus `json:"relays"`
	// UnownedShards counts lease rows with no live owner while pending rows
	// exist in them: nobody is publishing those shards.
	UnownedShards int              `json:"unowned_shards_with_pending"`
	Consumers     []ConsumerStatus `json:"consumers"`
	Effects       []EffectStatus   `json:"effects"`
	CDC           []CDCSlotStatus  `json:"cdc,omitempty"`
	// Sections says, for each part above, whether it was read, is not
	// installed, or failed (and why).
	Sections []SectionStatus `json:"sections"`
	// Missing names the tables (base names) that do not exist, whether
	// their section is not installed or failed.
	Missing []string `json:"missing,omitempty"`
}

// OutboxTotals sums the outbox.
type OutboxTotals struct {
	Pending          int64   `json:"pending"`
	OldestPendingAge float64 `json:"oldest_pending_age_seconds"`
	Dead             int64   `json:"dead"`
	Discarded        int64   `json:"discarded"`
	// CountsCapped: read WithCountCap and some shard reached the cap, so
	// Pending, Dead and Discarded are lower bounds.
	CountsCapped bool `json:"counts_capped,omitempty"`
}

// TopicStatus is the outbox backlog of one topic.
type TopicStatus struct {
	Topic            string  `json:"topic"`
	Pending          int64   `json:"pending"`
	OldestPendingAge float64 `json:"oldest_pending_age_seconds"`
	Dead             int64   `json:"dead"`
	CountsCapped     bool    `json:"counts_capped,omitempty"` // Pending and Dead are lower bounds
}

// ShardStatus is the backlog of one (topic, shard) and who holds the shard.
type ShardStatus struct {
	Topic            string     `json:"topic"`
	Shard            int        `json:"shard"`
	Pending          int64      `json:"pending"`
	OldestPendingAge float64    `json:"oldest_pending_age_seconds"`
	Dead             int64      `json:"dead"`
	CountsCapped     bool       `json:"counts_capped,omitempty"` // Pending and Dead are lower bounds (WithCountCap)
	LeaseOwner       string     `json:"lease_owner,omitempty"`
	LeaseFence       int64      `json:"lease_fence,omitempty"`
	LeaseExpiresAt   *time.Time `json:"lease_expires_at,omitempty"`
	LeaseLive        bool       `json:"lease_live"`
}

// RelayStatus is one relay instance as its heartbeat and leases show it.
// The breaker state is the relay's ferry_relay_breaker_state metric.
type RelayStatus struct {
	InstanceID  string    `json:"instance_id"`
	StartedAt   time.Time `json:"started_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
	Live        bool      `json:"live"`
	OwnedShards []int     `json:"owned_shards"`
	// Breaker is the relay's circuit breaker ("closed" or "open") as of its
	// last heartbeat; empty for an owner without an instance row.
	Breaker string `json:"breaker"`
}

// ConsumerStatus is one inbox consumer.
type ConsumerStatus struct {
	Consumer string `json:"consumer"`
	// AppliedLastMinute counts events applied in the last 60 s;
	// AppliedPerSecond is that divided by 60. (No all-time total: counting
	// the whole inbox on every scrape would scan it.)
	AppliedLastMinute int64           `json:"applied_last_minute"`
	AppliedPerSecond  float64         `json:"applied_per_second"`
	LastAppliedAt     *time.Time      `json:"last_applied_at,omitempty"`
	Parked            []ParkedSummary `json:"parked"`
	// OpenGaps counts aggregates with an open gap; OldestGapAge is the age
	// of the oldest parked gap successor.
	OpenGaps     int64   `json:"open_gaps"`
	OldestGapAge float64 `json:"oldest_gap_age_seconds"`
}

// ParkedSummary counts open parked messages of one reason.
type ParkedSummary struct {
	Reason    string  `json:"reason"`
	Count     int64   `json:"count"`
	OldestAge float64 `json:"oldest_age_seconds"`
}

// EffectStatus counts the open effect intents of one consumer by state
// (pending, in_flight, unknown); finished ones are not counted here.
type EffectStatus struct {
	Consumer         string           `json:"consumer"`
	ByState          map[string]int64 `json:"by_state"`
	OldestUnknownAge float64          `json:"oldest_unknown_age_seconds"`
}

// CDCSlotStatus is one CDC replication slot.
type CDCSlotStatus struct {
	Slot      string  `json:"slot"`
	Exists    bool    `json:"exists"`
	Active    bool    `json:"active"`
	LagBytes  float64 `json:"lag_bytes"`
	LostCount int64   `json:"lost_count"`
	LastError string  `json:"last_error,omitempty"`
}

// Status reads the snapshot, section by section (see Sections). A section
// whose tables are missing or unreadable never reads as zero: it is marked
// failed with the reason, its numbers are left empty, and Status returns a
// *StatusError (errors.Is ErrStatusIncomplete) together with everything
// the other sections read. A section that is not installed, and need not
// be, is reported as such without an error. Any other error (the database
// cannot be reached) is returned as is.
//
// By default every count is exact. WithCountCap bounds the outbox counts
// per (topic, shard) for a caller that refreshes often (the console's
// overview): on Postgres each shard's pending, dead and discarded rows are
// counted up to the cap from the unsent-row index, so the cost no longer
// grows with 100,000 dead letters; the oldest pending age stays exact
// (under a watermark relay, unless the pending count is capped).
//
// Pending is what is not sent yet, in both relay state designs: under a
// watermark relay (relay.WithSentWatermark) that is 'retry' rows and
// 'pending' rows above their shard's watermark, not the sent 'pending'
// rows at or below it.
func (o *Ops) Status(ctx context.Context, opts ...StatusOption) (Status, error) {
	var so statusOptions
	for _, opt := range opts {
		opt(&so)
	}
	exec := o.db.Executor()
	now := o.now()
	// Empty lists, not nulls, for programs reading --json.
	st := Status{At: now, Window: o.cfg.window, Topics: []TopicStatus{}, Shards: []ShardStatus{}, Relays: []RelayStatus{},
		Consumers: []ConsumerStatus{}, Effects: []EffectStatus{}, Sections: []SectionStatus{}}
	present, recorded, err := o.installed(ctx, exec)
	if err != nil {
		return st, err
	}
	read := map[string]func(context.Context, driver.Executor, time.Time, *Status) error{
		SectionOutbox: func(ctx context.Context, exec driver.Executor, now time.Time, st *Status) error {
			if so.countCap > 0 && o.pg() {
				return o.outboxStatusBounded(ctx, exec, now, st, so.countCap)
			}
			return o.outboxStatus(ctx, exec, now, st)
		},
		SectionRelay:   o.leaseStatus,
		SectionInbox:   o.consumerStatus,
		SectionEffects: o.effectStatus,
		SectionOps: func(ctx context.Context, exec driver.Executor, _ time.Time, st *Status) error {
			w, err := o.replayWindow(ctx, exec)
			st.Window = w
			return err
		},
		SectionCDC: o.cdcStatus,
		// Requests are listed by ListApprovals; status only checks the
		// table is there.
		SectionApprovals: func(context.Context, driver.Executor, time.Time, *Status) error { return nil },
		// Subject keys are the encrypt package's; status only checks the
		// table is there.
		SectionEncryption: func(context.Context, driver.Executor, time.Time, *Status) error { return nil },
		// The watermark history is cleanup's; status reads the watermark
		// through the outbox and relay sections.
		SectionWatermark: func(context.Context, driver.Executor, time.Time, *Status) error { return nil },
	}
	for _, def := range sections {
		if def.pgOnly && !o.pg() {
			continue
		}
		sec := SectionStatus{Name: def.name, Migration: def.migration, Tables: make([]string, len(def.tables))}
		anyPresent := false
		for i, base := range def.tables {
			sec.Tables[i] = o.cfg.tables.Bare(base)
			if present[base] {
				anyPresent = true
			} else {
				sec.Missing = append(sec.Missing, sec.Tables[i])
				st.Missing = append(st.Missing, base)
			}
		}
		sec.Required = def.always || anyPresent || recorded[def.version]
		switch {
		case len(sec.Missing) == 0:
			if err := read[def.name](ctx, exec, now, &st); err != nil {
				sec.State, sec.Error = SectionFailed, err.Error()
				def.reset(&st, o.cfg.window)
			} else {
				sec.State = SectionOK
			}
		case !sec.Required:
			sec.State = SectionNotInstalled
		default:
			sec.State = SectionFailed
			why := "other tables of that migration exist"
			switch {
			case def.always:
				why = "the outbox is always required"
			case recorded[def.version]:
				why = fmt.Sprintf("migration %s is recorded as applied", def.migration)
			}
			sec.Error = fmt.Sprintf("table %s missing (%s)", strings.Join(sec.Missing, ", "), why)
		}
		st.Sections = append(st.Sections, sec)
	}
	if failed := st.Failed(); len(failed) > 0 {
		return st, &StatusError{Failed: failed}
	}
	return st, nil
}

// Section names in Status.Sections, one per migration.
const (
	SectionOutbox  = "outbox"  // outbox backlog per topic and shard
	SectionRelay   = "relay"   // leases and relay instances
	SectionInbox   = "inbox"   // consumers, parked messages, gaps
	SectionEffects = "effects" // open effect intents
	SectionOps     = "ops"     // the replay window (ops_settings)
	SectionCDC     = "cdc"     // CDC slots
	// SectionApprovals: requested operator actions awaiting a human
	// (ops_approvals); checked for installation only.
	SectionApprovals = "approvals"
	// SectionEncryption: the per-subject data keys of payload encryption
	// (subject_keys, erased by ferry erase); checked for installation only.
	SectionEncryption = "encryption"
	// SectionWatermark: when the relays' watermarks were reached
	// (relay_watermarks, relay.WithSentWatermark, Postgres), which
	// cleanup reads; checked for installation only.
	SectionWatermark = "watermark"
)

// Section states.
const (
	SectionOK           = "ok"            // read
	SectionNotInstalled = "not_installed" // none of its tables exist and none need to
	SectionFailed       = "failed"        // a table that should exist is missing, or a query failed
)

// SectionStatus says whether one part of Status was read. Required is true
// for the outbox always, and for any other section once its migration is
// recorded as applied (`ferry migrate up` applies them all) or some of the
// tables that migration creates exist: a partial install is a failure,
// never "not installed".
type SectionStatus struct {
	Name      string   `json:"name"`
	State     string   `json:"state"`
	Required  bool     `json:"required"`
	Migration string   `json:"migration"`
	Tables    []string `json:"tables"`
	Missing   []string `json:"missing_tables,omitempty"`
	Error     string   `json:"error,omitempty"`
}

// Failed returns the sections that failed.
func (st Status) Failed() []SectionStatus {
	var out []SectionStatus
	for _, s := range st.Sections {
		if s.State == SectionFailed {
			out = append(out, s)
		}
	}
	return out
}

// SectionOK reports whether section name was read.
func (st Status) SectionOK(name string) bool {
	for _, s := range st.Sections {
		if s.Name == name {
			return s.State == SectionOK
		}
	}
	return false
}

// StatusError lists the sections Status could not read.
type StatusError struct {
	Failed []SectionStatus
}

func (e *StatusError) Error() string {
	parts := make([]string, len(e.Failed))
	for i, s := range e.Failed {
		parts[i] = fmt.Sprintf("section %s failed: %s", s.Name, s.Error)
	}
	return "ops: status incomplete: " + strings.Join(parts, "; ")
}

// Is reports ErrStatusIncomplete.
func (e *StatusError) Is(target error) bool { return target == ErrStatusIncomplete }

// sectionDef is one migration's tables and what Status reads from them.
// TestStatusSectionsMatchMigrations keeps the table lists equal to the
// tables each migration creates.
type sectionDef struct {
	name      string
	version   int
	migration string
	tables    []string
	always    bool
	pgOnly    bool // its migration creates nothing on SQLite
	// reset empties what a failed read may have half-written.
	reset func(st *Status, min Window)
}

var sections = []sectionDef{
	{name: SectionOutbox, version: 1, migration: "0001_outbox", tables: []string{"outbox", "aggregate_seq"}, always: true,
		reset: func(st *Status, _ Window) {
			st.Outbox, st.Topics, st.Shards = OutboxTotals{}, []TopicStatus{}, []ShardStatus{}
		}},
	{name: SectionRelay, version: 2, migration: "0002_relay", tables: []string{"relay_leases", "relay_instances"},
		reset: func(st *Status, _ Window) {
			for i := range st.Shards {
				s := &st.Shards[i]
				s.LeaseOwner, s.LeaseFence, s.LeaseExpiresAt, s.LeaseLive = "", 0, nil, false
			}
			st.Relays, st.UnownedShards = []RelayStatus{}, 0
		}},
	{name: SectionInbox, version: 3, migration: "0003_inbox", tables: []string{"inbox", "inbox_cursor", "inbox_parked"},
		reset: func(st *Status, _ Window) { st.Consumers = []ConsumerStatus{} }},
	{name: SectionEffects, version: 4, migration: "0004_effects", tables: []string{"command_keys", "effects"},
		reset: func(st *Status, _ Window) { st.Effects = []EffectStatus{} }},
	{name: SectionOps, version: 5, migration: "0005_ops", tables: []string{"ops_audit", "ops_settings"},
		reset: func(st *Status, min Window) { st.Window = min }},
	{name: SectionCDC, version: 6, migration: "0006_cdc", tables: []string{"cdc_slot"}, pgOnly: true,
		reset: func(st *Status, _ Window) { st.CDC = nil }},
	{name: SectionApprovals, version: 8, migration: "0008_approvals", tables: []string{"ops_approvals"},
		reset: func(*Status, Window) {}},
	{name: SectionEncryption, version: 10, migration: "0010_subject_keys", tables: []string{"subject_keys"},
		reset: func(*Status, Window) {}},
	{name: SectionWatermark, version: 12, migration: "0012_relay_watermark", tables: []string{"relay_watermarks"}, pgOnly: true,
		reset: func(*Status, Window) {}},
}

// installed returns which of the sections' tables exist and which
// migrations the migrations table records (none when it does not exist:
// the DDL may have been applied by another tool), in two queries.
func (o *Ops) installed(ctx context.Context, exec driver.Executor) (map[string]bool, map[int]bool, error) {
	byBare := map[string]string{}
	var args []any
	scope := ""
	if o.pg() || o.mysql() {
		scope, args = o.schemaScope(1)
	}
	var ph []string
	add := func(base string) {
		bare := o.cfg.tables.Bare(base)
		byBare[bare] = base
		args = append(args, bare)
		ph = append(ph, fmt.Sprintf("$%d", len(args)))
	}
	add("migrations")
	for _, def := range sections {
		for _, base := range def.tables {
			add(base)
		}
	}
	rows, err := exec.Query(ctx, o.installedTablesSQL(scope, ph), args...)
	if err != nil {
		return nil, nil, fmt.Errorf("ops: look up installed tables: %w", err)
	}
	present := map[string]bool{}
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return nil, nil, fmt.Errorf("ops: look up installed tables: %w", err)
		}
		present[byBare[name]] = true
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("ops: look up installed tables: %w", err)
	}
	recorded := map[int]bool{}
	if !present["migrations"] {
		return present, recorded, nil
	}
	rows, err = exec.Query(ctx, fmt.Sprintf(`SELECT version FROM %s`, o.t("migrations")))
	if err != nil {
		return nil, nil, fmt.Errorf("ops: read applied migrations: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int
		if err := rows.Scan(&v); err != nil {
			return nil, nil, fmt.Errorf("ops: read applied migrations: %w", err)
		}
		recorded[v] = true
	}
	return present, recorded, rows.Err()
}

func (o *Ops) outboxStatus(ctx context.Context, exec driver.Executor, now time.Time, st *Status) error {
	wm, err := o.watermarked(ctx, exec)
	if err != nil {
		return err
	}
	// status <> 'sent' is served by the unsent-aggregate partial index; sent
	// rows (the bulk) are never scanned.
	q := fmt.Sprintf(`SELECT topic, shard,
    SUM(CASE WHEN status = 'pending' THEN 1 ELSE 0 END),
    MIN(CASE WHEN status = 'pending' THEN created_at END),
    SUM(CASE WHEN status = 'dead' AND discarded_at IS NULL THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'dead' AND discarded_at IS NOT NULL THEN 1 ELSE 0 END)
FROM %s WHERE status <> 'sent' GROUP BY topic, shard ORDER BY topic, shard`, o.t("outbox"))
	if wm {
		q = o.outboxStatusWatermarkSQL()
	}
	rows, err := exec.Query(ctx, q)
	if err != nil {
		return fmt.Errorf("ops: outbox status: %w", err)
	}
	defer rows.Close()
	topics := map[string]*TopicStatus{}
	for rows.Next() {
		var s ShardStatus
		var oldest nullTime
		var discarded int64
		if err := rows.Scan(&s.Topic, &s.Shard, &s.Pending, &oldest, &s.Dead, &discarded); err != nil {
			return fmt.Errorf("ops: outbox status: %w", err)
		}
		s.OldestPendingAge = oldest.age(now)
		st.Shards = append(st.Shards, s)
		tp := topics[s.Topic]
		if tp == nil {
			tp = &TopicStatus{Topic: s.Topic}
			topics[s.Topic] = tp
		}
		tp.Pending += s.Pending
		tp.Dead += s.Dead
		tp.OldestPendingAge = max(tp.OldestPendingAge, s.OldestPendingAge)
		st.Outbox.Pending += s.Pending
		st.Outbox.Dead += s.Dead
		st.Outbox.Discarded += discarded
		st.Outbox.OldestPendingAge = max(st.Outbox.OldestPendingAge, s.OldestPendingAge)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("ops: outbox status: %w", err)
	}
	st.Topics = make([]TopicStatus, 0, len(topics))
	for _, tp := range topics {
		st.Topics = append(st.Topics, *tp)
	}
	sort.Slice(st.Topics, func(i, j int) bool { return st.Topics[i].Topic < st.Topics[j].Topic })
	return nil
}

// outboxStatusWatermarkSQL is outboxStatus's statement when a watermark
// relay may have kept sent rows 'pending' (see watermarked): there every
// sent row stays 'pending', so status <> 'sent' is the whole table. The
// unsent rows are read instead as the 'retry' and 'dead' rows (the small
// unsent (status, id) index) and the pending rows above their shard's
// watermark (aboveWatermark). Until a watermark relay has written state
// (watermarkInUse) the status design's statement runs instead, in the
// same snapshot; each branch is skipped by a one-time filter.
func (o *Ops) outboxStatusWatermarkSQL() string {
	t := o.cfg.tables
	return fmt.Sprintf(`WITH RECURSIVE w(used) AS (%[2]s),
%[3]s,
u(topic, shard, status, created_at, discarded_at) AS (
    SELECT topic, shard, status, created_at, discarded_at FROM %[1]s WHERE status <> 'sent' AND NOT (SELECT used FROM w)
  UNION ALL
    SELECT x.topic, x.shard, x.status, x.created_at, x.discarded_at FROM %[4]s
  UNION ALL
    SELECT topic, shard, status, created_at, discarded_at FROM %[1]s WHERE status IN ('retry', 'dead') AND (SELECT used FROM w)
)
SELECT topic, shard,
    SUM(CASE WHEN status IN ('pending', 'retry') THEN 1 ELSE 0 END),
    MIN(CASE WHEN status IN ('pending', 'retry') THEN created_at END),
    SUM(CASE WHEN status = 'dead' AND discarded_at IS NULL THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'dead' AND discarded_at IS NOT NULL THEN 1 ELSE 0 END)
FROM u GROUP BY topic, shard ORDER BY topic, shard`, o.t("outbox"), watermarkInUse(t),
		shardsWithPending(t, "(SELECT used FROM w)"), aboveWatermark(t, "topic, shard, status, created_at, discarded_at"))
}

func (o *Ops) leaseStatus(ctx context.Context, exec driver.Executor, now time.Time, st *Status) error {
	type lease struct {
		owner   string
		fence   int64
		expires nullTime
	}
	leases := map[int]lease{}
	rows, err := exec.Query(ctx, fmt.Sprintf(`SELECT shard, owner, fence, expires_at FROM %s ORDER BY shard`, o.t("relay_leases")))
	if err != nil {
		return fmt.Errorf("ops: lease status: %w", err)
	}
	var order []int
	for rows.Next() {
		var shard int
		var l lease
		if err := rows.Scan(&shard, &l.owner, &l.fence, &l.expires); err != nil {
			rows.Close()
			return fmt.Errorf("ops: lease status: %w", err)
		}
		leases[shard] = l
		order = append(order, shard)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("ops: lease status: %w", err)
	}
	live := func(l lease) bool { return l.owner != "" && l.expires.Valid && l.expires.Time.After(now) }
	unowned := map[int]bool{}
	for i := range st.Shards {
		s := &st.Shards[i]
		if l, ok := leases[s.Shard]; ok {
			s.LeaseOwner, s.LeaseFence, s.LeaseExpiresAt, s.LeaseLive = l.owner, l.fence, l.expires.ptr(), live(l)
		}
		if !s.LeaseLive && s.Pending > 0 {
			unowned[s.Shard] = true
		}
	}
	st.UnownedShards = len(unowned)
	owned := map[string][]int{}
	for _, shard := range order {
		if l := leases[shard]; live(l) {
			owned[l.owner] = append(owned[l.owner], shard)
		}
	}
	rows, err = exec.Query(ctx, fmt.Sprintf(`SELECT instance_id, started_at, heartbeat_at, expires_at, breaker FROM %s ORDER BY instance_id`, o.t("relay_instances")))
	if err != nil {
		return fmt.Errorf("ops: relay instances: %w", err)
	}
	defer rows.Close()
	seen := map[string]bool{}
	for rows.Next() {
		var r RelayStatus
		var started, hb, exp nullTime
		if err := rows.Scan(&r.InstanceID, &started, &hb, &exp, &r.Breaker); err != nil {
			return fmt.Errorf("ops: relay instances: %w", err)
		}
		r.StartedAt, r.HeartbeatAt = started.Time, hb.Time
		r.Live = exp.Valid && exp.Time.After(now)
		r.OwnedShards = owned[r.InstanceID]
		if r.OwnedShards == nil {
			r.OwnedShards = []int{}
		}
		seen[r.InstanceID] = true
		st.Relays = append(st.Relays, r)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("ops: relay instances: %w", err)
	}
	// An owner holding leases without an instance row (heartbeat pruned).
	for owner, shards := range owned {
		if !seen[owner] {
			st.Relays = append(st.Relays, RelayStatus{InstanceID: owner, OwnedShards: shards})
		}
	}
	sort.Slice(st.Relays, func(i, j int) bool { return st.Relays[i].InstanceID < st.Relays[j].InstanceID })
	return nil
}

func (o *Ops) consumerStatus(ctx context.Context, exec driver.Executor, now time.Time, st *Status) error {
	cons := map[string]*ConsumerStatus{}
	get := func(name string) *ConsumerStatus {
		c := cons[name]
		if c == nil {
			c = &ConsumerStatus{Consumer: name, Parked: []ParkedSummary{}}
			cons[name] = c
		}
		return c
	}
	// The inbox grows with every applied event, so no query here scans it:
	// consumers are found by a loose index scan (one index probe per
	// consumer on inbox_applied_idx), and each consumer's last-minute count
	// and latest applied_at are index range reads.
	names, err := o.distinct(ctx, exec, "inbox", "consumer", maxConsumers)
	if err != nil {
		return err
	}
	for _, name := range names {
		var lastMin int64
		var last nullTime
		if err := queryRow(ctx, exec, fmt.Sprintf(`SELECT count(*) FROM %s WHERE consumer = $1 AND applied_at >= $2`, o.t("inbox")),
			[]any{name, now.Add(-time.Minute)}, &lastMin); err != nil {
			return fmt.Errorf("ops: consumer status: %w", err)
		}
		if err := queryRow(ctx, exec, fmt.Sprintf(`SELECT MAX(applied_at) FROM %s WHERE consumer = $1`, o.t("inbox")), []any{name}, &last); err != nil {
			return fmt.Errorf("ops: consumer status: %w", err)
		}
		c := get(name)
		c.AppliedLastMinute, c.AppliedPerSecond, c.LastAppliedAt = lastMin, float64(lastMin)/60, last.ptr()
	}
	{
		rows, err := exec.Query(ctx, fmt.Sprintf(`SELECT consumer, reason, count(*), MIN(first_seen) FROM %s
WHERE resolved_at IS NULL GROUP BY consumer, reason ORDER BY consumer, reason`, o.t("inbox_parked")))
		if err != nil {
			return fmt.Errorf("ops: parked status: %w", err)
		}
		for rows.Next() {
			var name string
			var p ParkedSummary
			var oldest nullTime
			if err := rows.Scan(&name, &p.Reason, &p.Count, &oldest); err != nil {
				rows.Close()
				return fmt.Errorf("ops: parked status: %w", err)
			}
			p.OldestAge = oldest.age(now)
			c := get(name)
			c.Parked = append(c.Parked, p)
			if p.Reason == "gap" {
				c.OldestGapAge = p.OldestAge
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("ops: parked status: %w", err)
		}
		rows, err = exec.Query(ctx, fmt.Sprintf(`SELECT consumer, count(*) FROM (SELECT DISTINCT consumer, tenant_id, aggregate_type, aggregate_id
FROM %s WHERE reason = 'gap' AND resolved_at IS NULL) g GROUP BY consumer`, o.t("inbox_parked")))
		if err != nil {
			return fmt.Errorf("ops: gap status: %w", err)
		}
		for rows.Next() {
			var name string
			var n int64
			if err := rows.Scan(&name, &n); err != nil {
				rows.Close()
				return fmt.Errorf("ops: gap status: %w", err)
			}
			get(name).OpenGaps = n
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return fmt.Errorf("ops: gap status: %w", err)
		}
	}
	for _, c := range cons {
		st.Consumers = append(st.Consumers, *c)
	}
	sort.Slice(st.Consumers, func(i, j int) bool { return st.Consumers[i].Consumer < st.Consumers[j].Consumer })
	return nil
}

func (o *Ops) cdcStatus(ctx context.Context, exec driver.Executor, now time.Time, st *Status) error {
	q := fmt.Sprintf(`SELECT slot_name, lost_count, last_error, false, false, 0 FROM %s ORDER BY slot_name`, o.t("cdc_slot"))
	if o.pg() {
		q = fmt.Sprintf(`SELECT s.slot_name, s.lost_count, s.last_error, r.slot_name IS NOT NULL, COALESCE(r.active, false),
    COALESCE(pg_wal_lsn_diff(pg_current_wal_lsn(), r.confirmed_flush_lsn), 0)::float8
FROM %s s LEFT JOIN pg_replication_slots r ON r.slot_name = s.slot_name ORDER BY s.slot_name`, o.t("cdc_slot"))
	}
	rows, err := exec.Query(ctx, q)
	if err != nil {
		return fmt.Errorf("ops: cdc status: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var c CDCSlotStatus
		if err := rows.Scan(&c.Slot, &c.LostCount, &c.LastError, &c.Exists, &c.Active, &c.LagBytes); err != nil {
			return fmt.Errorf("ops: cdc status: %w", err)
		}
		st.CDC = append(st.CDC, c)
	}
	return rows.Err()
}

// maxConsumers bounds the consumers Status reports.
const maxConsumers = 1000

// distinct returns up to limit distinct values of col in table base, in
// order, by a loose index scan: each step is one probe of an index that
// starts with col, so the cost is per distinct value, not per row.
func (o *Ops) distinct(ctx context.Context, exec driver.Executor, base, col string, limit int) ([]string, error) {
	var out []string
	q := fmt.Sprintf(`SELECT MIN(%[1]s) FROM %[2]s WHERE %[1]s > $1`, col, o.t(base))
	prev := ""
	first := fmt.Sprintf(`SELECT MIN(%[1]s) FROM %[2]s`, col, o.t(base))
	for len(out) < limit {
		var v *string
		var err error
		if len(out) == 0 {
			err = queryRow(ctx, exec, first, nil, &v)
		} else {
			err = queryRow(ctx, exec, q, []any{prev}, &v)
		}
		if err != nil {
			return nil, fmt.Errorf("ops: list %s.%s: %w", base, col, err)
		}
		if v == nil {
			break
		}
		out = append(out, *v)
		prev = *v
	}
	return out, nil
}
