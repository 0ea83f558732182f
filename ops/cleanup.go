package ops

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/ferryhq/ferry/internal/outboxstate"
	"github.com/ferryhq/ferry/internal/partition"
)

// Window is the replay/redelivery window that cleanup must not undercut.
//
// A consumer's inbox row is what makes a redelivered event a no-op (G4).
// If the row is deleted while the event can still arrive again — the
// broker redelivers within its dedup window, an operator replays from the
// outbox, a consumer rewinds within the inbox's replay horizon — the event
// is applied a second time. So no retention may be shorter than either.
type Window struct {
	// BrokerDedupWindow is the broker's dedup/redelivery window
	// (JetStream's duplicate window, default 2 minutes).
	BrokerDedupWindow time.Duration `json:"broker_dedup_window"`
	// InboxReplayHorizon is how far back events may be redelivered or
	// replayed to consumers (default 7 days).
	InboxReplayHorizon time.Duration `json:"inbox_replay_horizon"`
}

// Min is the shortest retention the window allows: the larger of the two.
func (w Window) Min() time.Duration { return max(w.BrokerDedupWindow, w.InboxReplayHorizon) }

// Setting names in the ops_settings table.
const (
	SettingBrokerDedupWindow  = "broker_dedup_window"
	SettingInboxReplayHorizon = "inbox_replay_horizon"
)

// ReplayWindow returns the effective window: for each part, the larger of
// the stored setting and the WithMinimumWindow option.
func (o *Ops) ReplayWindow(ctx context.Context) (Window, error) {
	return o.replayWindow(ctx, o.db.Executor())
}

func (o *Ops) replayWindow(ctx context.Context, exec driver.Executor) (Window, error) {
	rows, err := exec.Query(ctx, fmt.Sprintf(`SELECT name, value_seconds FROM %s WHERE name IN ($1, $2)`, o.t("ops_settings")),
		SettingBrokerDedupWindow, SettingInboxReplayHorizon)
	if err != nil {
		return Window{}, fmt.Errorf("ops: read replay window settings: %w", err)
	}
	defer rows.Close()
	w := o.cfg.window
	for rows.Next() {
		var name string
		var secs int64
		if err := rows.Scan(&name, &secs); err != nil {
			return Window{}, fmt.Errorf("ops: read replay window settings: %w", err)
		}
		d := time.Duration(secs) * time.Second
		switch name {
		case SettingBrokerDedupWindow:
			w.BrokerDedupWindow = max(w.BrokerDedupWindow, d)
		case SettingInboxReplayHorizon:
			w.InboxReplayHorizon = max(w.InboxReplayHorizon, d)
		}
	}
	return w, rows.Err()
}

// SetReplayWindow stores the window in ops_settings (audited like every
// action; a dry run without Approve). Shortening it is how an operator
// deliberately allows shorter retention; the audit row records who and why.
func (o *Ops) SetReplayWindow(ctx context.Context, w Window, a Approval) (Result, error) {
	if w.BrokerDedupWindow < time.Second || w.InboxReplayHorizon < time.Second {
		return Result{}, &ArgError{Field: "window", Reason: "both durations must be at least 1s"}
	}
	if err := a.check(); err != nil {
		return Result{}, err
	}
	res := Result{Action: "settings.replay_window", DryRun: !a.Approve, Rows: 2}
	if !a.Approve {
		return res, nil
	}
	err := o.inTx(ctx, func(tx driver.Tx) error {
		for name, d := range map[string]time.Duration{SettingBrokerDedupWindow: w.BrokerDedupWindow, SettingInboxReplayHorizon: w.InboxReplayHorizon} {
			if _, err := tx.Exec(ctx, o.upsertSetting(),
				name, int64(d/time.Second), o.now()); err != nil {
				return fmt.Errorf("ops: store %s: %w", name, err)
			}
		}
		id, err := o.writeAudit(ctx, tx, res.Action, a, w, nil, 2)
		res.AuditID = id
		return err
	})
	if err != nil {
		return Result{}, err
	}
	return res, nil
}

// ErrWindowBelowBroker: a broker dedup window was asked for that is
// shorter than the broker's own setting; see *BrokerWindowError.
var ErrWindowBelowBroker = errors.New("ops: broker dedup window shorter than the broker's")

// BrokerWindowError names the window asked for and the broker's actual
// setting it undercuts.
type BrokerWindowError struct {
	Requested time.Duration // the broker dedup window to be stored
	Broker    time.Duration // the broker's setting, as read from the broker
	Source    string        // where Broker was read, e.g. `JetStream stream "FERRY" (Duplicates)`
}

func (e *BrokerWindowError) Error() string {
	return fmt.Sprintf("ops: refusing broker dedup window %s: %s is %s; the stored window stands for the broker's and must be at least %s "+
		"(a shorter one lets cleanup delete rows the broker's redelivery still needs)", e.Requested, e.Source, e.Broker, e.Broker)
}

// Is reports ErrWindowBelowBroker.
func (e *BrokerWindowError) Is(target error) bool { return target == ErrWindowBelowBroker }

// CheckBrokerWindow compares a window with the broker's actual dedup
// window (source says where it was read): a *BrokerWindowError when
// w.BrokerDedupWindow is shorter, nil otherwise. Callers read the broker's
// setting where it exists (JetStream: the stream's Duplicates); Kafka and
// RabbitMQ have no broker-side dedup window to compare with.
func CheckBrokerWindow(w Window, broker time.Duration, source string) error {
	if w.BrokerDedupWindow < broker {
		return &BrokerWindowError{Requested: w.BrokerDedupWindow, Broker: broker, Source: source}
	}
	return nil
}

// Cleanup limits.
const (
	DefaultCleanupBatch = 500
	MaxCleanupBatch     = 10000
)

// CleanupOptions says what to delete. Every retention must be at least the
// replay window; Cleanup refuses otherwise with ErrRetentionTooShort.
type CleanupOptions struct {
	// Retention keeps sent outbox rows published less than this long ago.
	Retention time.Duration
	// InboxRetention keeps inbox rows younger than this (default
	// Retention). It must be at least Retention: an outbox row that can
	// still be replayed needs its inbox rows to absorb the redelivery.
	InboxRetention time.Duration
	// EffectRetention keeps finished effect-ledger rows (succeeded, failed)
	// younger than this (default InboxRetention). Pending, in-flight and
	// unknown intents are never deleted.
	EffectRetention time.Duration
	// IncludeDiscarded also deletes discarded dead letters whose discard is
	// older than Retention. Dead letters that were not discarded are never
	// deleted: they are work for an operator.
	IncludeDiscarded bool
	// BatchSize bounds each DELETE (default DefaultCleanupBatch); each
	// batch is its own short transaction selecting rows by primary key.
	BatchSize int
	// MaxBatches stops after this many batches per table (0: until done).
	MaxBatches int
	// Pause sleeps between batches to leave room for the producers.
	Pause time.Duration
	// Archive, when set, receives each batch's rows before they are
	// deleted; a batch whose archive is not confirmed deletes nothing and
	// ends the cleanup with the error (see Archiver, package archive).
	Archive Archiver `json:"-"`
}

// CleanupResult counts deleted (or, on a dry run, eligible) rows per table.
type CleanupResult struct {
	DryRun    bool   `json:"dry_run"`
	Window    Window `json:"window"`
	Outbox    int64  `json:"outbox"`
	Discarded int64  `json:"discarded_dead_letters"`
	Inbox     int64  `json:"inbox"`
	// ResolvedParked counts resolved parked messages (open ones are never deleted).
	ResolvedParked int64 `json:"resolved_parked"`
	Effects        int64 `json:"effects"`
	Batches        int   `json:"batches"`
	// Archived counts rows copied to Archive (at ArchiveLocation) before
	// they were deleted.
	Archived        int64  `json:"archived,omitempty"`
	ArchiveLocation string `json:"archive,omitempty"`
	// Skipped names tables that are not installed (e.g. no inbox yet).
	Skipped []string `json:"skipped,omitempty"`
	// OutboxPartitions lists, for a partitioned outbox, every partition
	// that ended before the retention's cutoff: dropped (on a dry run:
	// would be), or kept with the reason. OutboxPartitionRows sums the
	// dropped partitions' estimated row counts.
	OutboxPartitions    []PartitionDrop `json:"outbox_partitions,omitempty"`
	OutboxPartitionRows int64           `json:"outbox_partition_rows_estimate,omitempty"`
	// InboxPartitions lists, for a partitioned inbox, every range
	// partition that ended before the inbox retention's cutoff: dropped
	// (on a dry run: would be), or kept with the reason (a claim applied
	// inside the retention). The default partition is never listed.
	// InboxPartitionRows sums the dropped ones' estimated row counts.
	InboxPartitions    []PartitionDrop `json:"inbox_partitions,omitempty"`
	InboxPartitionRows int64           `json:"inbox_partition_rows_estimate,omitempty"`
	// PartitionsCreated names the outbox and inbox partitions cleanup
	// created ahead.
	PartitionsCreated []string `json:"partitions_created,omitempty"`
	// PartitionsNotCreated says which inbox ranges could not be created
	// because the inbox's default partition holds rows of them
	// (partition.ErrDefaultHoldsRange); their claims stay in the default.
	PartitionsNotCreated string `json:"partitions_not_created,omitempty"`
	AuditID              int64  `json:"audit_id,omitempty"`
}

func (c *CleanupOptions) normalise() error {
	if c.Retention <= 0 {
		return &ArgError{Field: "retention", Reason: "must be > 0"}
	}
	if c.InboxRetention == 0 {
		c.InboxRetention = c.Retention
	}
	if c.EffectRetention == 0 {
		c.EffectRetention = c.InboxRetention
	}
	if c.InboxRetention < 0 || c.EffectRetention < 0 {
		return &ArgError{Field: "inbox_retention", Reason: "must be > 0"}
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultCleanupBatch
	}
	if c.BatchSize < 1 || c.BatchSize > MaxCleanupBatch {
		return &ArgError{Field: "batch_size", Reason: fmt.Sprintf("must be between 1 and %d", MaxCleanupBatch)}
	}
	if c.MaxBatches < 0 || c.Pause < 0 {
		return &ArgError{Field: "max_batches", Reason: "must be >= 0"}
	}
	return nil
}

// CheckRetention returns a *RetentionError (ErrRetentionTooShort) when opts
// would delete rows inside the window, naming both numbers.
func CheckRetention(opts CleanupOptions, w Window) error {
	if err := opts.normalise(); err != nil {
		return err
	}
	for _, c := range []struct {
		table string
		d     time.Duration
	}{{"outbox", opts.Retention}, {"inbox", opts.InboxRetention}, {"effects", opts.EffectRetention}} {
		if c.d < w.Min() {
			return &RetentionError{Table: c.table, Retention: c.d, Window: w.Min(), BrokerDedupWindow: w.BrokerDedupWindow, InboxReplayHorizon: w.InboxReplayHorizon}
		}
	}
	if opts.InboxRetention < opts.Retention {
		return &RetentionError{Table: "inbox", Retention: opts.InboxRetention, Window: opts.Retention,
			BrokerDedupWindow: w.BrokerDedupWindow, InboxReplayHorizon: w.InboxReplayHorizon,
			OutlivesOutbox: true}
	}
	return nil
}

// Cleanup deletes old rows in small batches: sent outbox rows published
// before now-Retention, discarded dead letters when asked, inbox rows and
// finished effect rows older than their retention. Each batch deletes at
// most BatchSize rows chosen by primary key in its own transaction (on
// Postgres with SKIP LOCKED, so it never waits behind the relay), so there
// is no table-wide delete and no long lock. It refuses, before touching
// anything, any retention shorter than the replay window.
//
// Without a.Approve it only counts what would go. An approved run writes
// one audit row with the totals. The relay can call it on a schedule
// (see RunCleanup) with Actor "relay/<instance>" and a fixed reason.
func (o *Ops) Cleanup(ctx context.Context, opts CleanupOptions, a Approval) (CleanupResult, error) {
	return o.cleanup(ctx, opts, a, true)
}

// cleanup is Cleanup; auditEmpty false skips the audit row of a run that
// deleted nothing (the scheduled mode would otherwise write one per tick).
func (o *Ops) cleanup(ctx context.Context, opts CleanupOptions, a Approval, auditEmpty bool) (CleanupResult, error) {
	if err := opts.normalise(); err != nil {
		return CleanupResult{}, err
	}
	if err := a.check(); err != nil {
		return CleanupResult{}, err
	}
	w, err := o.ReplayWindow(ctx)
	if err != nil {
		return CleanupResult{}, err
	}
	res := CleanupResult{DryRun: !a.Approve, Window: w}
	if err := CheckRetention(opts, w); err != nil {
		return res, err
	}
	if opts.Archive != nil {
		res.ArchiveLocation = opts.Archive.Location()
	}
	now := o.now()
	// A partitioned table drops whole partitions instead of deleting
	// their rows: the outbox's past Retention, the inbox's past
	// InboxRetention. With an archive the rows are archived and deleted by
	// the batches below first (an archive takes rows, not tables), and the
	// partitions they emptied are dropped after.
	var parted []partitionedTable
	for _, pt := range []partitionedTable{
		{partition.Outbox, now.Add(-opts.Retention), &res.OutboxPartitions, &res.OutboxPartitionRows},
		{partition.Inbox, now.Add(-opts.InboxRetention), &res.InboxPartitions, &res.InboxPartitionRows},
	} {
		ok, err := partition.IsPartitioned(ctx, o.db.Executor(), o.cfg.tables, pt.table)
		if err != nil {
			return res, fmt.Errorf("ops: cleanup: %w", err)
		}
		if ok {
			parted = append(parted, pt)
		}
	}
	if opts.Archive == nil {
		for _, pt := range parted {
			if err := o.dropPartitions(ctx, pt, opts, now, !a.Approve, &res); err != nil {
				return res, err
			}
		}
	}
	for _, tgt := range o.cleanupTargets(ctx, opts, now, &res) {
		if tgt.skip {
			continue
		}
		n, batches, err := o.deleteBatches(ctx, tgt, opts, !a.Approve)
		res.Batches += batches
		*tgt.count += n
		if opts.Archive != nil && a.Approve && !tgt.bookkeeping {
			res.Archived += n
		}
		if err != nil {
			return res, err
		}
	}
	if opts.Archive != nil {
		for _, pt := range parted {
			if err := o.dropPartitions(ctx, pt, opts, now, !a.Approve, &res); err != nil {
				return res, err
			}
		}
	}
	total := res.Outbox + res.Discarded + res.Inbox + res.ResolvedParked + res.Effects + res.OutboxPartitionRows + res.InboxPartitionRows
	if a.Approve && (total > 0 || auditEmpty || len(res.PartitionsCreated) > 0) {
		// Rows already deleted are audited even if ctx ended meanwhile.
		actx := context.WithoutCancel(ctx)
		err := o.inTx(actx, func(tx driver.Tx) error {
			id, err := o.writeAudit(actx, tx, "cleanup", a, struct {
				CleanupOptions
				Result CleanupResult `json:"result"`
			}{opts, res}, nil, total)
			res.AuditID = id
			return err
		})
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// RunCleanup runs Cleanup every interval until ctx ends; it is the
// scheduled mode for a long-running process such as the relay. A run that
// deletes nothing writes no audit row. Errors of
// one run are logged and the next run tries again, except a retention
// error, which is returned at once (the configuration is wrong).
func (o *Ops) RunCleanup(ctx context.Context, every time.Duration, opts CleanupOptions, a Approval) error {
	if every <= 0 {
		return &ArgError{Field: "every", Reason: "must be > 0"}
	}
	a.Approve = true
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		res, err := o.cleanup(ctx, opts, a, false)
		switch {
		case errors.Is(err, ErrRetentionTooShort), errors.Is(err, ErrInvalidArgument), errors.Is(err, ErrReasonRequired), errors.Is(err, ErrActorRequired):
			return err
		case err != nil && ctx.Err() == nil:
			o.cfg.log.WarnContext(ctx, "ferry cleanup failed", logattr.Err(err))
		case err == nil:
			o.cfg.log.InfoContext(ctx, "ferry cleanup", "outbox", res.Outbox, "inbox", res.Inbox, "effects", res.Effects, "batches", res.Batches)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// cleanupTarget is one table's eligible rows: a condition on the table
// and the primary key to delete by.
type cleanupTarget struct {
	table string
	key   string // primary key: a column or a row constructor "(a, b)"
	sel   string // the select list for key (default key)
	cond  string
	args  []any
	count *int64
	skip  bool
	// bookkeeping: Ferry's own state, not events: deleted without an
	// archive even when the run archives.
	bookkeeping bool
}

func (o *Ops) cleanupTargets(ctx context.Context, opts CleanupOptions, now time.Time, res *CleanupResult) []cleanupTarget {
	out := []cleanupTarget{
		{table: "outbox", key: "id", cond: "status = 'sent' AND published_at < $1", args: []any{now.Add(-opts.Retention)}, count: &res.Outbox},
	}
	if o.pg() {
		if ok, err := o.tableExists(ctx, o.db.Executor(), "relay_watermarks"); err == nil && ok {
			out = append(out, o.watermarkCleanupTargets(now.Add(-opts.Retention), res)...)
		}
	}
	if opts.IncludeDiscarded {
		out = append(out, cleanupTarget{table: "outbox", key: "id", cond: "status = 'dead' AND discarded_at IS NOT NULL AND discarded_at < $1",
			args: []any{now.Add(-opts.Retention)}, count: &res.Discarded})
	}
	out = append(out, o.inboxCleanupTargets(ctx, opts, now, res)...)
	out = append(out, o.effectCleanupTargets(ctx, opts, now, res)...)
	return out
}

// deleteBatches deletes (or counts) t's rows in batches of opts.BatchSize.
func (o *Ops) deleteBatches(ctx context.Context, t cleanupTarget, opts CleanupOptions, dryRun bool) (int64, int, error) {
	exec := o.db.Executor()
	if dryRun {
		var n int64
		err := queryRow(ctx, exec, fmt.Sprintf(`SELECT count(*) FROM %s WHERE %s`, o.t(t.table), t.cond), t.args, &n)
		if err != nil {
			return 0, 0, fmt.Errorf("ops: count %s cleanup: %w", t.table, err)
		}
		return n, 0, nil
	}
	q := o.cleanupDelete(t, opts.BatchSize)
	if t.bookkeeping {
		opts.Archive = nil
	}
	schema := 0
	if opts.Archive != nil {
		schema = o.schemaVersion(ctx)
	}
	var total int64
	batches := 0
	for opts.MaxBatches == 0 || batches < opts.MaxBatches {
		if err := ctx.Err(); err != nil {
			return total, batches, err
		}
		var n, seen int64
		var err error
		if opts.Archive != nil {
			// Archive first; delete only what the archive confirmed.
			n, seen, err = o.archiveThenDelete(ctx, t, opts, schema)
		} else {
			n, err = exec.Exec(ctx, q, t.args...)
			seen = n
		}
		if err != nil {
			return total, batches, fmt.Errorf("ops: cleanup %s: %w", t.table, err)
		}
		batches++
		total += n
		if seen < int64(opts.BatchSize) {
			break
		}
		if opts.Pause > 0 {
			select {
			case <-ctx.Done():
				return total, batches, ctx.Err()
			case <-time.After(opts.Pause):
			}
		}
	}
	return total, batches, nil
}

// PartitionDrop is cleanup's verdict on one outbox or inbox partition.
type PartitionDrop struct {
	Name string    `json:"name"`
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// Dropped: detached and dropped (on a dry run: would be).
	Dropped bool `json:"dropped"`
	// RowsEstimate is the planner's estimate (pg_class.reltuples).
	RowsEstimate int64 `json:"rows_estimate"`
	// Kept says why a partition past the cutoff stays.
	Kept string `json:"kept,omitempty"`
	// ExclusiveMillis: how long the table was locked exclusively for the
	// detach (lock wait included); its writers wait at most this.
	ExclusiveMillis float64 `json:"exclusive_ms,omitempty"`
}

// partitionedTable is one partitioned table cleanup drops partitions of:
// its cutoff (now minus its retention) and where its verdicts go.
type partitionedTable struct {
	table    partition.Table
	cutoff   time.Time
	verdicts *[]PartitionDrop
	rows     *int64
}

// dropPartitions creates pt's partitions ahead and drops each partition
// that ended before its cutoff and passes the guard checked under the
// partition's lock (partition.Drop): in the outbox every row sent and
// published before the cutoff (discarded dead letters too with
// IncludeDiscarded); in the inbox every claim applied before it. The
// retentions were checked against the replay window before.
func (o *Ops) dropPartitions(ctx context.Context, pt partitionedTable, opts CleanupOptions, now time.Time, dryRun bool, res *CleanupResult) error {
	if !dryRun {
		// Partitions an earlier run detached but could not drop; first, so
		// that Ensure cannot mistake one for a partition that exists.
		if _, err := partition.DropDetached(ctx, o.db.Executor(), o.cfg.tables, pt.table); err != nil {
			return fmt.Errorf("ops: cleanup: %w", err)
		}
		created, err := partition.Ensure(ctx, o.db.Executor(), o.cfg.tables, pt.table, now, 0, partition.DefaultAhead)
		res.PartitionsCreated = append(res.PartitionsCreated, created...)
		switch {
		case errors.Is(err, partition.ErrDefaultHoldsRange):
			res.PartitionsNotCreated = err.Error()
			o.cfg.log.WarnContext(ctx, "inbox partitions not created: the default partition holds rows of their range", logattr.Err(err))
		case err != nil:
			return fmt.Errorf("ops: cleanup: %w", err)
		}
	}
	parts, err := partition.List(ctx, o.db.Executor(), o.cfg.tables, pt.table)
	if err != nil {
		return fmt.Errorf("ops: cleanup: %w", err)
	}
	g := partition.Guard{Cutoff: pt.cutoff}
	if opts.IncludeDiscarded {
		g.DiscardedBefore = &g.Cutoff
	}
	for _, p := range parts {
		if p.To.After(g.Cutoff) {
			break // in bound order: the rest end later
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		v, err := partition.Drop(ctx, o.db, o.cfg.tables, pt.table, p, g, dryRun)
		if err != nil {
			// A lock not granted in time (a long transaction on the table),
			// or a deadlock with a writer of the partition (an inbox claim
			// of an old event waits on the partition's lock while holding
			// the table's, which the detach needs), leaves the partition
			// for the next run; anything else stops.
			if !isLockTimeout(err) && !isDeadlock(err) {
				return fmt.Errorf("ops: cleanup: %w", err)
			}
			v.Dropped = false
			v.Kept = "its lock was not granted within " + partition.LockTimeout.String() + "; retried at the next run"
			o.cfg.log.WarnContext(ctx, string(pt.table)+" partition not dropped: lock not granted", "partition", p.Name)
		}
		*pt.verdicts = append(*pt.verdicts, PartitionDrop{Name: v.Name, From: v.From, To: v.To,
			Dropped: v.Dropped, RowsEstimate: v.RowsEstimate, Kept: v.Kept, ExclusiveMillis: v.ExclusiveMillis})
		if v.Dropped {
			*pt.rows += v.RowsEstimate
		}
	}
	return nil
}

// isLockTimeout reports Postgres' lock_not_available (55P03).
func isLockTimeout(err error) bool {
	var coded interface{ SQLState() string }
	return errors.As(err, &coded) && coded.SQLState() == "55P03"
}

// isDeadlock reports Postgres' deadlock_detected (40P01).
func isDeadlock(err error) bool {
	var coded interface{ SQLState() string }
	return errors.As(err, &coded) && coded.SQLState() == "40P01"
}

// watermarkCleanupTargets are the rows a relay in the watermark design
// (relay.WithSentWatermark) sent: 'pending' rows at or below their
// shard's watermark. They have no published_at; relay_watermarks records
// when each watermark was reached, so a shard's rows up to the highest
// watermark recorded before the cutoff were all published before it.
// Then the history entries older than the cutoff that a newer one (also
// older than the cutoff) supersedes.
func (o *Ops) watermarkCleanupTargets(cutoff time.Time, res *CleanupResult) []cleanupTarget {
	outbox, hist := o.t("outbox"), o.t("relay_watermarks")
	return []cleanupTarget{
		{table: "outbox", key: "id", args: []any{cutoff}, count: &res.Outbox,
			cond: "status = 'pending' AND id <= " + outboxstate.SentBefore(o.cfg.tables, outbox+".shard", "$1")},
		{table: "relay_watermarks", key: "(shard, at)", sel: "shard, at", args: []any{cutoff}, count: new(int64), bookkeeping: true,
			cond: fmt.Sprintf(`at < $1 AND EXISTS (SELECT 1 FROM %[1]s n WHERE n.shard = %[1]s.shard AND n.at > %[1]s.at AND n.at < $1)`, hist)},
	}
}
