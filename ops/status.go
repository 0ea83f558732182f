package ops

import (
	"context"
	"fmt"
	"sort"
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
	// Missing names optional tables that are not installed.
	Missing []string `json:"missing,omitempty"`
}

// OutboxTotals sums the outbox.
type OutboxTotals struct {
	Pending          int64   `json:"pending"`
	OldestPendingAge float64 `json:"oldest_pending_age_seconds"`
	Dead             int64   `json:"dead"`
	Discarded        int64   `json:"discarded"`
}

// TopicStatus is the outbox backlog of one topic.
type TopicStatus struct {
	Topic            string  `json:"topic"`
	Pending          int64   `json:"pending"`
	OldestPendingAge float64 `json:"oldest_pending_age_seconds"`
	Dead             int64   `json:"dead"`
}

// ShardStatus is the backlog of one (topic, shard) and who holds the shard.
type ShardStatus struct {
	Topic            string     `json:"topic"`
	Shard            int        `json:"shard"`
	Pending          int64      `json:"pending"`
	OldestPendingAge float64    `json:"oldest_pending_age_seconds"`
	Dead             int64      `json:"dead"`
	LeaseOwner       string     `json:"lease_owner,omitempty"`
	LeaseFence       int64      `json:"lease_fence,omitempty"`
	LeaseExpiresAt   *time.Time `json:"lease_expires_at,omitempty"`
	LeaseLive        bool       `json:"lease_live"`
}

// RelayStatus is one relay instance as its heartbeat and leases show it.
// The breaker state is not stored in the tables; it is the relay's
// ferry_relay_breaker_open metric.
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

// Status reads the snapshot. Optional tables (leases, inbox, effects, CDC)
// are reported when installed and listed in Missing otherwise.
func (o *Ops) Status(ctx context.Context) (Status, error) {
	exec := o.db.Executor()
	now := o.now()
	// Empty lists, not nulls, for programs reading --json.
	st := Status{At: now, Topics: []TopicStatus{}, Shards: []ShardStatus{}, Relays: []RelayStatus{},
		Consumers: []ConsumerStatus{}, Effects: []EffectStatus{}}
	var err error
	if st.Window, err = o.replayWindow(ctx, exec); err != nil {
		return st, err
	}
	if err := o.outboxStatus(ctx, exec, now, &st); err != nil {
		return st, err
	}
	for _, part := range []struct {
		table string
		fn    func(context.Context, driver.Executor, time.Time, *Status) error
	}{
		{"relay_leases", o.leaseStatus},
		{"inbox", o.consumerStatus},
		{"effects", o.effectStatus},
		{"cdc_slot", o.cdcStatus},
	} {
		ok, err := o.tableExists(ctx, exec, part.table)
		if err != nil {
			return st, err
		}
		if !ok {
			st.Missing = append(st.Missing, part.table)
			continue
		}
		if err := part.fn(ctx, exec, now, &st); err != nil {
			return st, err
		}
	}
	return st, nil
}

func (o *Ops) outboxStatus(ctx context.Context, exec driver.Executor, now time.Time, st *Status) error {
	// status <> 'sent' is served by the unsent-aggregate partial index; sent
	// rows (the bulk) are never scanned.
	rows, err := exec.Query(ctx, fmt.Sprintf(`SELECT topic, shard,
    SUM(CASE WHEN status = 'pending' THEN 1 ELSE 0 END),
    MIN(CASE WHEN status = 'pending' THEN created_at END),
    SUM(CASE WHEN status = 'dead' AND discarded_at IS NULL THEN 1 ELSE 0 END),
    SUM(CASE WHEN status = 'dead' AND discarded_at IS NOT NULL THEN 1 ELSE 0 END)
FROM %s WHERE status <> 'sent' GROUP BY topic, shard ORDER BY topic, shard`, o.t("outbox")))
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
	ok, err := o.tableExists(ctx, exec, "relay_instances")
	if err != nil || !ok {
		return err
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
	if ok, err := o.tableExists(ctx, exec, "inbox_parked"); err != nil {
		return err
	} else if ok {
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
