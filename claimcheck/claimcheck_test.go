package claimcheck_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	"gocloud.dev/blob"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/claimcheck"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

const stream = "CC"

func TestMain(m *testing.M) {
	if os.Getenv("CLAIMCHECK_CRASH_CHILD") != "" {
		crashChild()
		return
	}
	goleak.VerifyTestMain(m, testenv.KnownLibraryLeaks()...)
}

// crashChild writes one large event inside a transaction on the SQLite
// database CLAIMCHECK_CRASH_CHILD names, with blobs in CLAIMCHECK_BUCKET,
// then SIGKILLs itself before the commit: the blob is written, the row
// never commits.
func crashChild() {
	ctx := context.Background()
	db, err := sqlite.Open(os.Getenv("CLAIMCHECK_CRASH_CHILD"))
	if err != nil {
		os.Exit(2)
	}
	drv := sqlite.New(db)
	st, err := claimcheck.Open(ctx, os.Getenv("CLAIMCHECK_BUCKET"), 1024)
	if err != nil {
		os.Exit(3)
	}
	w, err := outbox.New(drv, outbox.WithShardCount(4), outbox.WithClaimCheck(st))
	if err != nil {
		os.Exit(4)
	}
	tx, _, err := drv.BeginTx(ctx)
	if err != nil {
		os.Exit(5)
	}
	out, err := w.InsertTx(ctx, tx, big("crash", 'c'))
	if err != nil {
		os.Exit(6)
	}
	os.Stdout.WriteString("ID " + out[0].ID.String() + "\n")
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	time.Sleep(time.Minute)
}

// big is a 300 KiB event: over the default 256 KiB payload limit.
func big(agg string, fill byte) ferry.Event {
	p := append([]byte(`{"blob":"`), bytes.Repeat([]byte{fill}, 300<<10)...)
	p = append(p, `"}`...)
	return ferry.Event{TenantID: "acme", AggregateType: "doc", AggregateID: agg, EventType: "doc.uploaded", SchemaVersion: 1, Payload: p}
}

type stack[TTx any] struct {
	drv    driver.Driver[TTx]
	ops    *ops.Ops
	nc     *nats.Conn
	store  *claimcheck.Store
	bucket string
}

func newStack[TTx any](t *testing.T, drv driver.Driver[TTx], db ops.DB) *stack[TTx] {
	t.Helper()
	ctx := context.Background()
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	o, err := ops.New(db)
	if err != nil {
		t.Fatal(err)
	}
	emb, err := natsembed.Start(natsembed.WithStoreDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emb.Close() })
	nc, err := natsjs.Connect(emb.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: stream, Subjects: []string{"doc.events"}}); err != nil {
		t.Fatal(err)
	}
	pub, err := natsjs.NewPublisher(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	r, err := relay.New(db, pub, relay.WithShardCount(4), relay.WithPollInterval(20*time.Millisecond), relay.WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("relay: %v", err)
		}
	})
	bucket := "file://" + t.TempDir() + "?create_dir=1"
	st, err := claimcheck.Open(ctx, bucket, 1024)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return &stack[TTx]{drv: drv, ops: o, nc: nc, store: st, bucket: bucket}
}

func (s *stack[TTx]) writer(t *testing.T) *outbox.Writer[TTx] {
	t.Helper()
	w, err := outbox.New(s.drv, outbox.WithShardCount(4), outbox.WithClaimCheck(s.store),
		outbox.WithTopicTemplate(ferry.TopicTemplate("doc.events")))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

type seen struct {
	mu sync.Mutex
	m  map[string]ferry.Event
}

func (g *seen) get(id string) (ferry.Event, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ev, ok := g.m[id]
	return ev, ok
}

// consume runs an inbox named name that opens claim-checks from s.store.
func (s *stack[TTx]) consume(t *testing.T, name string) *seen {
	t.Helper()
	got := &seen{m: map[string]ferry.Event{}}
	h := func(_ context.Context, _ TTx, ev ferry.Event) error {
		got.mu.Lock()
		defer got.mu.Unlock()
		got.m[ev.ID.String()] = ev
		return nil
	}
	ib, err := inbox.New(s.drv, name, h, inbox.WithClaimCheck(s.store), inbox.WithRegisterer(prometheus.NewRegistry()), inbox.WithoutOrdering())
	if err != nil {
		t.Fatal(err)
	}
	cons, err := natsjs.NewConsumer(context.Background(), s.nc, stream, name)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ib.Run(ctx, cons) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("inbox %s: %v", name, err)
		}
		_ = cons.Close()
	})
	return got
}

func (s *stack[TTx]) rowPayload(t *testing.T, id string) []byte {
	t.Helper()
	var p []byte
	if _, err := driver.QueryRow(context.Background(), s.drv.Executor(), `SELECT payload FROM ferry_outbox WHERE event_id = $1`, []any{id}, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

func (s *stack[TTx]) parkedReasons(t *testing.T, consumer string) map[string]string {
	t.Helper()
	ps, err := s.ops.ListParked(context.Background(), ops.ParkedFilter{Consumer: consumer})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range ps {
		out[p.EventID] = p.Reason
	}
	return out
}

func (s *stack[TTx]) exists(ctx context.Context, id string) (bool, error) {
	_, err := s.ops.Message(ctx, id)
	if errors.Is(err, ops.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

func (s *stack[TTx]) bucketHandle(t *testing.T) *blob.Bucket {
	t.Helper()
	b, err := blob.OpenBucket(context.Background(), s.bucket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestClaimCheckSQLite(t *testing.T) {
	db, _ := testenv.NewSQLite(t)
	drv := sqlite.New(db)
	endToEnd(t, newStack(t, drv, drv))
}

func TestClaimCheckMySQL(t *testing.T) {
	d := testenv.NewMySQLDatabase(t)
	drv := mysql.New(d.DB)
	endToEnd(t, newStack(t, drv, drv))
}

func TestClaimCheckPostgres(t *testing.T) {
	s := testenv.NewPostgresSchema(t)
	drv := pgxv5.New(s.Pool)
	endToEnd(t, newStack(t, drv, drv))
}

// endToEnd: a payload over the row limit travels by reference and reaches
// the handler byte for byte; a tampered and a missing blob park with
// reason claimcheck; a rolled-back write's blob is swept, referenced ones
// never are; a sweeper without the row check deletes a referenced blob
// and the consumer then parks it (the check is what protects it).
func endToEnd[TTx any](t *testing.T, s *stack[TTx]) {
	ctx := context.Background()
	w := s.writer(t)
	ins := func(ev ferry.Event) ferry.Event {
		t.Helper()
		out, err := w.Insert(ctx, ev)
		if err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	// Without the claim-check the same event is refused by the limits.
	plain, err := outbox.New(s.drv, outbox.WithShardCount(4))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Insert(ctx, big("x", 'x')); !errors.Is(err, ferry.ErrInvalidEvent) {
		t.Fatalf("300 KiB payload without claim-check: %v, want ErrInvalidEvent", err)
	}

	a, b, c := ins(big("a", 'a')), ins(big("b", 'b')), ins(big("c", 'c'))
	small := ins(ferry.Event{TenantID: "acme", AggregateType: "doc", AggregateID: "s", EventType: "doc.uploaded", SchemaVersion: 1, Payload: []byte(`{"small":true}`)})
	row := s.rowPayload(t, a.ID.String())
	if len(row) > 1024 || !bytes.Contains(row, []byte(`"sha256:`)) || bytes.Contains(row, []byte("aaaa")) {
		t.Fatalf("outbox row holds %d bytes (%.60q…), want a reference", len(row), row)
	}
	if !bytes.Equal(s.rowPayload(t, small.ID.String()), []byte(`{"small":true}`)) {
		t.Fatal("a payload under the threshold was offloaded")
	}
	waitUntil(t, "the relay sends all four", func() bool {
		for _, ev := range []ferry.Event{a, b, c, small} {
			m, err := s.ops.Message(ctx, ev.ID.String())
			if err != nil || m.Status != "sent" {
				return false
			}
		}
		return true
	})

	// Tamper with b's blob, delete c's.
	bk := s.bucketHandle(t)
	if err := bk.WriteAll(ctx, claimcheck.Key(b.ID), bytes.Repeat([]byte{'z'}, 300<<10+11), nil); err != nil {
		t.Fatal(err)
	}
	if err := bk.Delete(ctx, claimcheck.Key(c.ID)); err != nil {
		t.Fatal(err)
	}
	got := s.consume(t, "docs")
	waitUntil(t, "a and small applied", func() bool {
		_, ok1 := got.get(a.ID.String())
		_, ok2 := got.get(small.ID.String())
		return ok1 && ok2
	})
	ga, _ := got.get(a.ID.String())
	want := big("a", 'a')
	if !bytes.Equal(ga.Payload, want.Payload) || ga.ContentType != ferry.DefaultContentType {
		t.Fatalf("handler got %d bytes, content type %q; want the original %d bytes, %q", len(ga.Payload), ga.ContentType, len(want.Payload), ferry.DefaultContentType)
	}
	waitUntil(t, "b and c parked", func() bool { r := s.parkedReasons(t, "docs"); return len(r) == 2 })
	r := s.parkedReasons(t, "docs")
	if r[b.ID.String()] != "claimcheck" || r[c.ID.String()] != "claimcheck" {
		t.Fatalf("parked %v, want b and c with reason claimcheck", r)
	}
	if _, ok := got.get(b.ID.String()); ok {
		t.Fatal("the tampered payload reached the handler")
	}

	// A rolled-back write leaves an orphan blob.
	tx, dtx, err := s.drv.BeginTx(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := w.InsertTx(ctx, tx, big("rolled-back", 'r'))
	if err != nil {
		t.Fatal(err)
	}
	if err := dtx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, _ := bk.Exists(ctx, claimcheck.Key(rb[0].ID)); !ok {
		t.Fatal("the rolled-back write's blob is not there to sweep")
	}
	opts := claimcheck.SweepOptions{Grace: time.Hour, Retention: 7 * 24 * time.Hour}
	res, err := s.store.Sweep(ctx, s.exists, opts)
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 0 || res.Young != res.Listed {
		t.Fatalf("sweep inside the grace period: %+v, want nothing deleted", res)
	}
	opts.Now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	if res, err = s.store.Sweep(ctx, s.exists, opts); err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 1 || res.Referenced != 2 { // a and b (c was deleted above)
		t.Fatalf("sweep: %+v, want the orphan deleted and a, b kept", res)
	}
	if ok, _ := bk.Exists(ctx, claimcheck.Key(rb[0].ID)); ok {
		t.Fatal("the orphan is still there")
	}
	if ok, _ := bk.Exists(ctx, claimcheck.Key(a.ID)); !ok {
		t.Fatal("the sweeper deleted a committed row's blob")
	}
	opts.Now = func() time.Time { return time.Now().Add(8 * 24 * time.Hour) }
	if res, _ = s.store.Sweep(ctx, func(context.Context, string) (bool, error) { return false, nil }, opts); res.Deleted != 0 || res.Old != 2 {
		t.Fatalf("sweep past retention: %+v, want nothing deleted (rows may be cleaned up)", res)
	}

	// Negative control: without the row check a referenced blob goes, and
	// a consumer that reads it later parks it.
	opts.Now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	if res, _ = s.store.Sweep(ctx, func(context.Context, string) (bool, error) { return false, nil }, opts); res.Deleted != 2 {
		t.Fatalf("control sweep without the row check: %+v, want a's and b's blobs deleted", res)
	}
	s.consume(t, "late")
	waitUntil(t, "the late consumer parks a", func() bool { return s.parkedReasons(t, "late")[a.ID.String()] == "claimcheck" })
}

// TestCrashBetweenBlobAndCommit: a producer SIGKILLed after its blob was
// written and before its transaction committed leaves an orphan; the
// sweeper removes it once past the grace period, and nothing else.
func TestCrashBetweenBlobAndCommit(t *testing.T) {
	db, path := testenv.NewSQLite(t)
	drv := sqlite.New(db)
	s := newStack(t, drv, drv)
	ctx := context.Background()
	kept, err := s.writer(t).Insert(ctx, big("kept", 'k'))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "CLAIMCHECK_CRASH_CHILD="+path, "CLAIMCHECK_BUCKET="+s.bucket)
	out, _ := cmd.Output()
	id, ok := strings.CutPrefix(strings.TrimSpace(string(out)), "ID ")
	if !ok {
		t.Fatalf("child printed %q", out)
	}
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended %v, want SIGKILL", cmd.ProcessState)
	}
	bk := s.bucketHandle(t)
	if ok, _ := bk.Exists(ctx, claimcheck.KeyPrefix+id); !ok {
		t.Fatal("the killed producer's blob is not there")
	}
	if ok, _ := s.exists(ctx, id); ok {
		t.Fatal("the killed producer's row committed")
	}
	res, err := s.store.Sweep(ctx, s.exists, claimcheck.SweepOptions{Grace: time.Hour, Retention: 24 * time.Hour,
		Now: func() time.Time { return time.Now().Add(2 * time.Hour) }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Deleted != 1 || res.Referenced != 1 {
		t.Fatalf("sweep: %+v, want the orphan deleted and the committed one kept", res)
	}
	if ok, _ := bk.Exists(ctx, claimcheck.Key(kept[0].ID)); !ok {
		t.Fatal("the committed row's blob was deleted")
	}
}

func TestSweepOptionsValidated(t *testing.T) {
	st, err := claimcheck.Open(context.Background(), "mem://", 10)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	yes := func(context.Context, string) (bool, error) { return true, nil }
	for _, tc := range []struct {
		o     claimcheck.SweepOptions
		field string
	}{
		{claimcheck.SweepOptions{Grace: time.Second, Retention: time.Hour}, "claimcheck.sweep.grace"},
		{claimcheck.SweepOptions{Grace: time.Hour, Retention: time.Hour}, "claimcheck.sweep.retention"},
	} {
		_, err := st.Sweep(context.Background(), yes, tc.o)
		var ce *ferry.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field {
			t.Errorf("%+v: %v, want a ConfigError on %s", tc.o, err, tc.field)
		}
	}
	if _, err := claimcheck.Open(context.Background(), "mem://", 0); err == nil {
		t.Error("threshold 0 accepted")
	}
}
