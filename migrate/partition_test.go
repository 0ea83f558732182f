package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/partition"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
)

// TestPartitionedOutbox: WithPartitionedOutbox creates the outbox
// partitioned by created_at with contiguous partitions from the current
// interval to DefaultAhead beyond it; a later Up without the option keeps
// them ahead; the option is refused, naming it, on a plain outbox, with
// another interval, on SQLite and MySQL, and below a second.
func TestPartitionedOutbox(t *testing.T) {
	ctx := context.Background()
	s := testenv.NewPostgresSchema(t)
	db := pgxv5.New(s.Pool)
	tables := ferry.Tables{}
	if _, err := migrate.Up(ctx, db, tables, migrate.WithPartitionedOutbox(time.Hour)); err != nil {
		t.Fatal(err)
	}
	ok, err := partition.IsPartitioned(ctx, db.Executor(), tables, partition.Outbox)
	if err != nil || !ok {
		t.Fatalf("partitioned = %v, %v", ok, err)
	}
	now := time.Now().UTC()
	parts := hourlyAhead(t, db.Executor(), tables, partition.Outbox, now)
	// A DEFAULT partition a user adds is neither listed nor in the way.
	if _, err := s.Pool.Exec(ctx, `CREATE TABLE ferry_outbox_default PARTITION OF ferry_outbox DEFAULT`); err != nil {
		t.Fatal(err)
	}
	if again, err := partition.List(ctx, db.Executor(), tables, partition.Outbox); err != nil || len(again) != len(parts) {
		t.Fatalf("with a default partition: %d partitions (%v), want %d", len(again), err, len(parts))
	}
	if _, err := partition.Ensure(ctx, db.Executor(), tables, partition.Outbox, now.Add(3*time.Hour), 0, partition.DefaultAhead); err != nil {
		t.Fatalf("Ensure with a default partition: %v", err)
	}
	// A second Up (nothing to apply) with or without the option is fine.
	if _, err := migrate.Up(ctx, db, tables); err != nil {
		t.Fatal(err)
	}
	if _, err := migrate.Up(ctx, db, tables, migrate.WithPartitionedOutbox(time.Hour)); err != nil {
		t.Fatal(err)
	}
	var ce *ferry.ConfigError
	if _, err := migrate.Up(ctx, db, tables, migrate.WithPartitionedOutbox(24*time.Hour)); !errors.As(err, &ce) || ce.Field != "partitioned_outbox" {
		t.Fatalf("another interval: %v", err)
	}

	checkPartitionRefusals(t, tables, "partitioned_outbox", migrate.WithPartitionedOutbox)
}

// hourlyAhead lists tb's partitions and checks they are contiguous, an
// hour wide, named by their start and cover now .. now+DefaultAhead hours.
func hourlyAhead(t *testing.T, exec driver.Executor, tables ferry.Tables, tb partition.Table, now time.Time) []partition.Part {
	t.Helper()
	parts, err := partition.List(context.Background(), exec, tables, tb)
	if err != nil {
		t.Fatal(err)
	}
	if len(parts) < partition.DefaultAhead+1 || parts[0].From.After(now) || parts[len(parts)-1].To.Before(now.Add(partition.DefaultAhead*time.Hour)) {
		t.Fatalf("%s partitions %+v do not cover now .. now+%dh", tb, parts, partition.DefaultAhead)
	}
	for i, p := range parts {
		if p.To.Sub(p.From) != time.Hour || (i > 0 && !p.From.Equal(parts[i-1].To)) || p.Name != partition.Name(tables, tb, p.From) {
			t.Fatalf("%s partition %d %+v is not contiguous, an hour wide and named by its start", tb, i, p)
		}
	}
	return parts
}

// TestEnsureConcurrent: relays and cleanup create partitions at the same
// time; none fails and every partition exists once.
func TestEnsureConcurrent(t *testing.T) {
	for _, tb := range []partition.Table{partition.Outbox, partition.Inbox} {
		t.Run(string(tb), func(t *testing.T) { ensureConcurrent(t, tb) })
	}
}

func ensureConcurrent(t *testing.T, tb partition.Table) {
	ctx := context.Background()
	s := testenv.NewPostgresSchema(t)
	db := pgxv5.New(s.Pool)
	tables := ferry.Tables{}
	opt := migrate.WithPartitionedOutbox(time.Second)
	if tb == partition.Inbox {
		opt = migrate.WithPartitionedInbox(time.Second)
	}
	if _, err := migrate.Up(ctx, db, tables, opt); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := partition.Ensure(ctx, db.Executor(), tables, tb, later, 0, partition.DefaultAhead)
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("concurrent Ensure: %v", err)
		}
	}
	parts, err := partition.List(ctx, db.Executor(), tables, tb)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < len(parts); i++ {
		if !parts[i].From.Equal(parts[i-1].To) {
			t.Fatalf("gap or overlap between %+v and %+v", parts[i-1], parts[i])
		}
	}
	if last := parts[len(parts)-1]; last.To.Before(later.Add(partition.DefaultAhead * time.Second)) {
		t.Fatalf("last partition %+v ends before %s", last, later.Add(partition.DefaultAhead*time.Second))
	}
}

// TestPartitionedInbox: WithPartitionedInbox creates the inbox partitioned
// by event_id, with the current range, DefaultAhead more, and the default
// partition; every index of the inbox (the primary key, the cleanup index,
// the event id index) exists on every partition; the bounds are the
// UUIDv7 prefixes of the range's times. Refused, naming the option, on a
// plain inbox, with another interval, on SQLite and MySQL, below a second.
// An inbox range whose rows already sit in the default partition is
// skipped (ErrDefaultHoldsRange), not a failed migration.
func TestPartitionedInbox(t *testing.T) {
	ctx := context.Background()
	s := testenv.NewPostgresSchema(t)
	db := pgxv5.New(s.Pool)
	tables := ferry.Tables{}
	if _, err := migrate.Up(ctx, db, tables, migrate.WithPartitionedInbox(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if ok, err := partition.IsPartitioned(ctx, db.Executor(), tables, partition.Inbox); err != nil || !ok {
		t.Fatalf("inbox partitioned = %v, %v", ok, err)
	}
	if ok, err := partition.IsPartitioned(ctx, db.Executor(), tables, partition.Outbox); err != nil || ok {
		t.Fatalf("the outbox was not asked to be partitioned: %v, %v", ok, err)
	}
	now := time.Now().UTC()
	parts := hourlyAhead(t, db.Executor(), tables, partition.Inbox, now)
	var bound string
	if err := s.Pool.QueryRow(ctx, `SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = $1`, parts[0].Name).Scan(&bound); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("FOR VALUES FROM ('%s') TO ('%s')", partition.UUIDv7Prefix(parts[0].From), partition.UUIDv7Prefix(parts[0].To)); bound != want {
		t.Fatalf("bound %q, want %q", bound, want)
	}
	var def string
	if err := s.Pool.QueryRow(ctx, `SELECT pg_get_expr(relpartbound, oid) FROM pg_class WHERE relname = 'ferry_inbox_default'`).Scan(&def); err != nil || def != "DEFAULT" {
		t.Fatalf("default partition: %q, %v", def, err)
	}
	// Every partition carries the inbox's three indexes.
	var missing int
	if err := s.Pool.QueryRow(ctx, `SELECT count(*) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'ferry_inbox'::regclass AND (SELECT count(*) FROM pg_index x WHERE x.indrelid = c.oid) <> 3`).Scan(&missing); err != nil || missing != 0 {
		t.Fatalf("%d partitions without the inbox's 3 indexes (%v)", missing, err)
	}
	// A claim whose id's time is in a range lands there; ids outside go to the default.
	inRange, err := partition.UUIDv7At(now)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []uuid.UUID{inRange, uuid.New()} {
		if _, err := s.Pool.Exec(ctx, `INSERT INTO ferry_inbox (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
VALUES ('c', 't', $1, '\x00', 'a', '1', 1, 'e', now())`, id); err != nil {
			t.Fatal(err)
		}
	}
	var where string
	if err := s.Pool.QueryRow(ctx, `SELECT tableoid::regclass::text FROM ferry_inbox WHERE event_id = $1`, inRange).Scan(&where); err != nil || where != partition.Name(tables, partition.Inbox, now.Truncate(time.Hour)) {
		t.Fatalf("claim of now in %q (%v)", where, err)
	}

	// A row in the default whose id falls in a range not made yet blocks
	// that range only: Up skips it and makes the others.
	later := parts[len(parts)-1].To.Add(2 * time.Hour)
	ahead, err := partition.UUIDv7At(later.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Pool.Exec(ctx, `INSERT INTO ferry_inbox (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
VALUES ('c', 't', $1, '\x00', 'a', '2', 1, 'e', now())`, ahead); err != nil {
		t.Fatal(err)
	}
	created, err := partition.Ensure(ctx, db.Executor(), tables, partition.Inbox, later, 0, 2)
	var dre *partition.DefaultRowsError
	if !errors.Is(err, partition.ErrDefaultHoldsRange) || !errors.As(err, &dre) || len(dre.Parts) != 1 || !dre.Parts[0].From.Equal(later) {
		t.Fatalf("Ensure over a range the default holds: created %v, %v", created, err)
	}
	if len(created) == 0 || slices.Contains(created, partition.Name(tables, partition.Inbox, later)) {
		t.Fatalf("created %v: want the ranges around %s, not it", created, later)
	}
	t.Logf("blocked range reported: %v", err)
	if _, err := migrate.Up(ctx, db, tables, migrate.WithPartitionedInbox(time.Hour)); err != nil {
		t.Fatalf("Up with a blocked range: %v", err)
	}

	var ce *ferry.ConfigError
	if _, err := migrate.Up(ctx, db, tables, migrate.WithPartitionedInbox(24*time.Hour)); !errors.As(err, &ce) || ce.Field != "partitioned_inbox" || !strings.Contains(ce.Reason, "partitioned by 1h0m0s") {
		t.Fatalf("another interval: %v", err)
	}
	checkPartitionRefusals(t, tables, "partitioned_inbox", migrate.WithPartitionedInbox)
	// Both tables partitioned at once.
	both := pgxv5.New(testenv.NewPostgresSchema(t).Pool)
	if _, err := migrate.Up(ctx, both, tables, migrate.WithPartitionedOutbox(24*time.Hour), migrate.WithPartitionedInbox(24*time.Hour)); err != nil {
		t.Fatal(err)
	}
	for _, tb := range []partition.Table{partition.Outbox, partition.Inbox} {
		if ok, err := partition.IsPartitioned(ctx, both.Executor(), tables, tb); err != nil || !ok {
			t.Fatalf("%s partitioned = %v, %v", tb, ok, err)
		}
	}
}

// TestInboxSQLPartitioned: migrate.SQL with WithPartitionedInbox prints the
// partitioned inbox, its default partition and its event id index; without
// it, the plain inbox.
func TestInboxSQLPartitioned(t *testing.T) {
	ddl, err := migrate.SQL(driver.Postgres, ferry.Tables{}, migrate.WithPartitionedInbox(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`) PARTITION BY RANGE (event_id);`, `CREATE TABLE "ferry_inbox_default" PARTITION OF "ferry_inbox" DEFAULT;`,
		`CREATE INDEX "ferry_inbox_event_idx" ON "ferry_inbox" (event_id);`, `PRIMARY KEY (consumer, tenant_id, event_id)`} {
		if !strings.Contains(ddl, want) {
			t.Errorf("partitioned DDL lacks %q", want)
		}
	}
	plain, err := migrate.SQL(driver.Postgres, ferry.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(plain, "PARTITION BY RANGE (event_id)") || strings.Contains(plain, "inbox_default") || strings.Contains(plain, "inbox_event_idx") {
		t.Error("plain DDL partitions the inbox")
	}
}

// TestInboxRangeCreationLocks: creating an inbox range takes only SHARE
// UPDATE EXCLUSIVE on the inbox (claims of the ranges go on while the
// default partition is scanned), ACCESS EXCLUSIVE on the default
// partition alone. Control: CREATE TABLE … PARTITION OF, as the outbox's
// ranges are made, locks the whole inbox ACCESS EXCLUSIVE.
func TestInboxRangeCreationLocks(t *testing.T) {
	ctx := context.Background()
	s := testenv.NewPostgresSchema(t)
	db := pgxv5.New(s.Pool)
	tables := ferry.Tables{}
	if _, err := migrate.Up(ctx, db, tables, migrate.WithPartitionedInbox(time.Hour)); err != nil {
		t.Fatal(err)
	}
	locks := func(create func(tx driver.Tx) error) map[string]string {
		t.Helper()
		tx, err := db.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = tx.Rollback(ctx) }()
		if err := create(tx); err != nil {
			t.Fatal(err)
		}
		rows, err := tx.Query(ctx, `SELECT c.relname, l.mode FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
WHERE l.pid = pg_backend_pid() AND c.relname IN ('ferry_inbox', 'ferry_inbox_default')`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		held := map[string]string{}
		for rows.Next() {
			var rel, mode string
			if err := rows.Scan(&rel, &mode); err != nil {
				t.Fatal(err)
			}
			if mode == "AccessExclusiveLock" || held[rel] != "AccessExclusiveLock" {
				held[rel] = mode
			}
		}
		return held
	}
	later := time.Now().UTC().Truncate(time.Hour).Add(30 * time.Hour)
	got := locks(func(tx driver.Tx) error {
		ok, err := partition.Create(ctx, tx, tables, partition.Inbox, later, time.Hour)
		if err == nil && !ok {
			err = errors.New("not created")
		}
		return err
	})
	if got["ferry_inbox"] == "AccessExclusiveLock" || got["ferry_inbox_default"] != "AccessExclusiveLock" {
		t.Fatalf("locks creating an inbox range: %v", got)
	}
	control := locks(func(tx driver.Tx) error {
		_, err := tx.Exec(ctx, fmt.Sprintf(`CREATE TABLE ferry_inbox_control PARTITION OF ferry_inbox FOR VALUES FROM ('%s') TO ('%s')`,
			partition.UUIDv7Prefix(later), partition.UUIDv7Prefix(later.Add(time.Hour))))
		return err
	})
	if control["ferry_inbox"] != "AccessExclusiveLock" {
		t.Fatalf("control: CREATE TABLE … PARTITION OF holds %v", control)
	}
	t.Logf("creating a range holds %v; CREATE TABLE … PARTITION OF holds %v", got, control)
}

// checkPartitionRefusals: a partitioned table is chosen when the table is
// first created, on Postgres, with an interval of at least a second —
// anything else is a *ferry.ConfigError naming field.
func checkPartitionRefusals(t *testing.T, tables ferry.Tables, field string, with func(time.Duration) migrate.Option) {
	t.Helper()
	var ce *ferry.ConfigError
	plain := pgxv5.New(testenv.NewPostgresSchema(t).Pool) // not converted by Up
	if _, err := migrate.Up(context.Background(), plain, tables); err != nil {
		t.Fatal(err)
	}
	if _, err := migrate.Up(context.Background(), plain, tables, with(time.Hour)); !errors.As(err, &ce) || ce.Field != field || !strings.Contains(ce.Reason, "plain table") {
		t.Fatalf("%s on a plain table: %v", field, err)
	}
	for _, d := range []driver.Dialect{driver.SQLite, driver.MySQL} {
		if _, err := migrate.Load(d, tables, with(time.Hour)); !errors.As(err, &ce) || ce.Field != field {
			t.Errorf("%s on %s: %v", field, d, err)
		}
	}
	if _, err := migrate.Load(driver.Postgres, tables, with(time.Millisecond)); !errors.As(err, &ce) || ce.Field != field {
		t.Errorf("%s of 1ms: %v", field, err)
	}
}
