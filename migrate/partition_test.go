package migrate_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

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
	parts, err := partition.List(ctx, db.Executor(), tables, partition.Outbox)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	if len(parts) < partition.DefaultAhead+1 || parts[0].From.After(now) || parts[len(parts)-1].To.Before(now.Add(partition.DefaultAhead*time.Hour)) {
		t.Fatalf("partitions %+v do not cover now .. now+%dh", parts, partition.DefaultAhead)
	}
	for i, p := range parts {
		if p.To.Sub(p.From) != time.Hour || (i > 0 && !p.From.Equal(parts[i-1].To)) || p.Name != partition.Name(tables, partition.Outbox, p.From) {
			t.Fatalf("partition %d %+v is not contiguous, an hour wide and named by its start", i, p)
		}
	}
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

	// A plain outbox is not converted by Up.
	plain := pgxv5.New(testenv.NewPostgresSchema(t).Pool)
	if _, err := migrate.Up(ctx, plain, tables); err != nil {
		t.Fatal(err)
	}
	if _, err := migrate.Up(ctx, plain, tables, migrate.WithPartitionedOutbox(time.Hour)); !errors.As(err, &ce) || !strings.Contains(ce.Reason, "plain table") {
		t.Fatalf("plain outbox: %v", err)
	}
	for _, d := range []driver.Dialect{driver.SQLite, driver.MySQL} {
		if _, err := migrate.Load(d, tables, migrate.WithPartitionedOutbox(time.Hour)); !errors.As(err, &ce) || ce.Field != "partitioned_outbox" {
			t.Errorf("%s: %v", d, err)
		}
	}
	if _, err := migrate.Load(driver.Postgres, tables, migrate.WithPartitionedOutbox(time.Millisecond)); !errors.As(err, &ce) || ce.Field != "partitioned_outbox" {
		t.Errorf("1ms: %v", err)
	}
}

// TestEnsureConcurrent: relays and cleanup create partitions at the same
// time; none fails and every partition exists once.
func TestEnsureConcurrent(t *testing.T) {
	ctx := context.Background()
	s := testenv.NewPostgresSchema(t)
	db := pgxv5.New(s.Pool)
	tables := ferry.Tables{}
	if _, err := migrate.Up(ctx, db, tables, migrate.WithPartitionedOutbox(time.Second)); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := partition.Ensure(ctx, db.Executor(), tables, partition.Outbox, later, 0, partition.DefaultAhead)
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
	parts, err := partition.List(ctx, db.Executor(), tables, partition.Outbox)
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
