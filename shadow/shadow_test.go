package shadow_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
	"github.com/ferryhq/ferry/shadow"
)

func TestMain(m *testing.M) {
	testenv.Announce("shadow", testenv.NATS, testenv.RabbitMQ)
	goleak.VerifyTestMain(m, testenv.KnownLibraryLeaks()...)
}

func msg(seq uint64, id, body string) shadow.Message {
	h := map[string]string{}
	if id != "" {
		h["ce-id"] = id
	}
	return shadow.Message{Seq: seq, Headers: h, Body: []byte(body)}
}

func TestCompareTable(t *testing.T) {
	prod := []shadow.Message{msg(1, "a", `{"n":1}`), msg(2, "c", `{"n":3}`), msg(3, "b", `{"n":2}`), msg(4, "x", `{}`), msg(5, "d", `{"n": 4}`), msg(6, "d", `{"n":4}`), msg(7, "e", `{"n":50}`)}
	sh := []shadow.Message{msg(1, "a", `{"n":1}`), msg(2, "b", `{"n":2}`), msg(3, "c", `{"n":3}`), msg(4, "d", `{"n":4}`), msg(5, "e", `{"n":5}`), msg(6, "lost", `{}`)}
	k, _ := shadow.ParseKey("id")
	r := shadow.Compare(prod, sh, k)
	want := &shadow.Report{Key: "id", Production: 7, Shadow: 6, Missing: []string{"lost"}, Extra: []string{"x"}, Reordered: []string{"c"}, Differing: []string{"e"}, Duplicates: 1}
	if !reflect.DeepEqual(r, want) {
		t.Fatalf("report\n got %+v\nwant %+v", r, want)
	}
	if r.Clean() {
		t.Error("Clean() on a report with differences")
	}
	if r := shadow.Compare(sh, sh, k); !r.Clean() {
		t.Errorf("a stream against itself: %+v", r)
	}
	// Business key from the body; a message without it is a key error.
	jk, err := shadow.ParseKey("json:/order/id")
	if err != nil {
		t.Fatal(err)
	}
	r = shadow.Compare([]shadow.Message{msg(1, "", `{"order":{"id":"o-1"}}`), msg(2, "", `{"other":1}`)}, []shadow.Message{msg(1, "z", `{"order":{"id":"o-1"}}`)}, jk)
	if len(r.KeyErrors) != 1 || !strings.Contains(r.KeyErrors[0], "production: message 2: body has no /order/id") || len(r.Missing)+len(r.Extra) != 0 {
		t.Errorf("json key: %+v", r)
	}
	for _, bad := range []string{"json:order", "ce:", "name"} {
		if _, err := shadow.ParseKey(bad); err == nil {
			t.Errorf("ParseKey(%q) accepted", bad)
		}
	}
}

// TestShadowRelayCompareNATS: the "old" code publishes each order's payload
// to production itself and loses every 7th (injected), publishes one order
// whose transaction rolled back, and one with a wrong total; the outbox
// writes every committed order and the real relay publishes through
// shadow.Publisher to shadow.<subject>. Compare on the real NATS server
// finds exactly the dropped orders missing, the rolled-back one extra, the
// wrong one differing, nothing reordered.
func TestShadowRelayCompareNATS(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc, err := natsjs.Connect(testenv.NATSURL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	sfx := strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	subject := "shadowtest." + sfx + ".order.events"
	prodStream, shadowStream := "SHADOWTEST_PROD_"+sfx, "SHADOWTEST_SHADOW_"+sfx
	for name, subj := range map[string]string{prodStream: subject, shadowStream: "shadow." + subject} {
		if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: name, Subjects: []string{subj}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	}

	db, _ := testenv.NewSQLite(t)
	drv := sqlite.New(db)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(drv)
	if err != nil {
		t.Fatal(err)
	}
	const n = 50
	var dropped []string
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("o-%d", i)
		payload := fmt.Sprintf(`{"order_id":%q,"total":%d}`, id, i)
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.InsertTx(ctx, tx, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: id, EventType: "order.created",
			SchemaVersion: 1, Topic: subject, Payload: []byte(payload)}); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
		// the old code's publish after commit
		switch {
		case i%7 == 0:
			dropped = append(dropped, id) // lost: the process died, the broker was down…
			continue
		case i == 10:
			payload = fmt.Sprintf(`{"order_id":%q,"total":%d}`, id, 999)
		}
		if _, err := js.Publish(ctx, subject, []byte(payload)); err != nil {
			t.Fatal(err)
		}
	}
	// The old code published for a transaction that then rolled back.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.InsertTx(ctx, tx, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: "o-rolled", EventType: "order.created", SchemaVersion: 1, Topic: subject, Payload: []byte(`{"order_id":"o-rolled","total":1}`)}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, subject, []byte(`{"order_id":"o-rolled","total":1}`)); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback()

	pub, err := natsjs.NewPublisher(nc)
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	sp, err := shadow.NewPublisher(pub, "shadow.")
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(drv, sp, relay.WithPollInterval(20*time.Millisecond), relay.WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(runCtx) }()
	waitSent(t, ctx, db, n)
	stop()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("relay: %v", err)
	}

	prod, err := shadow.ReadNATS(ctx, js, prodStream, "", time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	sh, err := shadow.ReadNATS(ctx, js, shadowStream, "shadow."+subject, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	key, _ := shadow.ParseKey("json:/order_id")
	rep := shadow.Compare(prod, sh, key)
	if rep.Production != n-len(dropped)+1 || rep.Shadow != n {
		t.Fatalf("read production %d, shadow %d; want %d and %d", rep.Production, rep.Shadow, n-len(dropped)+1, n)
	}
	if !reflect.DeepEqual(rep.Missing, dropped) {
		t.Errorf("missing %v, want exactly the %d dropped %v", rep.Missing, len(dropped), dropped)
	}
	if !reflect.DeepEqual(rep.Extra, []string{"o-rolled"}) || !reflect.DeepEqual(rep.Differing, []string{"o-10"}) || len(rep.Reordered) != 0 || len(rep.KeyErrors) != 0 {
		t.Errorf("report %+v: want extra [o-rolled], differing [o-10], nothing reordered", rep)
	}
	// By event id, the old path's bare payloads have no id: each is a key error.
	idKey, _ := shadow.ParseKey("id")
	if rep := shadow.Compare(prod, sh, idKey); len(rep.KeyErrors) != len(prod) {
		t.Errorf("by id: %d key errors, want %d", len(rep.KeyErrors), len(prod))
	}
}

func waitSent(t *testing.T, ctx context.Context, db *sql.DB, n int) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var sent int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM ferry_outbox WHERE status = 'sent'`).Scan(&sent); err != nil {
			t.Fatal(err)
		}
		if sent == n {
			return
		}
	}
	t.Fatalf("the relay did not mark %d rows sent in time", n)
}

// TestCompareScopes: a pair stored in the other order counts as reordered
// when both are in one ordering scope, never across scopes (Kafka keys);
// the control without scopes counts it.
func TestCompareScopes(t *testing.T) {
	scoped := func(seq uint64, id, scope string) shadow.Message {
		m := msg(seq, id, `{}`)
		m.Scope = scope
		return m
	}
	k, _ := shadow.ParseKey("id")
	sh := []shadow.Message{scoped(1, "a", "k1"), scoped(2, "b", "k2"), scoped(3, "c", "k1"), scoped(4, "d", "k1")}
	prod := []shadow.Message{scoped(1, "b", "k2"), scoped(2, "a", "k1"), scoped(3, "d", "k1"), scoped(4, "c", "k1")}
	if r := shadow.Compare(prod, sh, k); !reflect.DeepEqual(r.Reordered, []string{"d"}) {
		t.Errorf("scoped: reordered %v, want [d] (a/b are different keys)", r.Reordered)
	}
	for i := range sh {
		sh[i].Scope, prod[i].Scope = "", ""
	}
	if r := shadow.Compare(prod, sh, k); len(r.Reordered) != 2 {
		t.Errorf("one scope: reordered %v, want 2 (b and d)", r.Reordered)
	}
}
