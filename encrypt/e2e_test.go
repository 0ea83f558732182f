package encrypt_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/archive"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/encrypt"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/outbox"
	"github.com/ferryhq/ferry/relay"
)

const (
	stream    = "ENC"
	subject42 = "customer-42"
	// dupWindow is the stream's duplicate window: short, so a replay after
	// it reaches the consumers again.
	dupWindow = 200 * time.Millisecond
)

// stack is the whole path: outbox with encryption → relay → embedded
// JetStream → inbox consumers with decryption, on one database.
type stack[TTx any] struct {
	drv   driver.Driver[TTx]
	db    ops.DB
	ops   *ops.Ops
	nc    *nats.Conn
	js    jetstream.JetStream
	rings map[string]*encrypt.LocalKeyring
}

func rules() []encrypt.Option {
	return []encrypt.Option{
		encrypt.WithEventType("customer.updated", encrypt.Rule{Subject: func(ev ferry.Event) (string, error) { return ev.AggregateID, nil }}),
		encrypt.WithEventType("order.created", encrypt.Rule{}),
	}
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
		t.Fatalf("embedded nats: %v", err)
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
	if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: stream, Subjects: []string{"customer.events", "order.events"}, DuplicateWindow: dupWindow}); err != nil {
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
	return &stack[TTx]{drv: drv, db: db, ops: o, nc: nc, js: js, rings: map[string]*encrypt.LocalKeyring{
		"k1":    ring(t, "k1", map[string][]byte{"k1": key(1)}),
		"k1+k2": ring(t, "k2", map[string][]byte{"k1": key(1), "k2": key(2)}),
		"wrong": ring(t, "k2", map[string][]byte{"k1": key(3), "k2": key(2)}), // k1 has other bytes
	}}
}

func (s *stack[TTx]) writer(t *testing.T, ringName string) *outbox.Writer[TTx] {
	t.Helper()
	c, err := encrypt.New(s.rings[ringName], rules()...)
	if err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(s.drv, outbox.WithShardCount(4), outbox.WithEncryption(c))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// seen records what a consumer's handler got: event id → payload.
type seen struct {
	mu sync.Mutex
	m  map[string]ferry.Event
}

func (s *seen) get(id string) (ferry.Event, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ev, ok := s.m[id]
	return ev, ok
}

// newInbox builds (does not run) an inbox named name whose codec opens
// with ringName's keys; its handler records what it sees.
func (s *stack[TTx]) newInbox(t *testing.T, name, ringName string) (*inbox.Inbox[TTx], *seen) {
	t.Helper()
	c, err := encrypt.New(s.rings[ringName], append(rules(), encrypt.WithSubjectKeyStore(s.drv.Executor()))...)
	if err != nil {
		t.Fatal(err)
	}
	got := &seen{m: map[string]ferry.Event{}}
	h := func(_ context.Context, _ TTx, ev ferry.Event) error {
		got.mu.Lock()
		defer got.mu.Unlock()
		got.m[ev.ID.String()] = ev
		return nil
	}
	ib, err := inbox.New(s.drv, name, h, inbox.WithDecryption(c), inbox.WithRegisterer(prometheus.NewRegistry()), inbox.WithoutOrdering())
	if err != nil {
		t.Fatal(err)
	}
	return ib, got
}

// consume runs an inbox named name on the stream with a decrypting codec
// over ringName; it stops at cleanup and must not have failed.
func (s *stack[TTx]) consume(t *testing.T, name, ringName string) (*seen, *inbox.Inbox[TTx]) {
	t.Helper()
	ib, got := s.newInbox(t, name, ringName)
	cons, err := natsjs.NewConsumer(context.Background(), s.nc, stream, name)
	if err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ib.Run(cctx, cons) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("inbox %s run: %v", name, err)
		}
		_ = cons.Close()
	})
	return got, ib
}

func (s *stack[TTx]) outboxPayload(t *testing.T, id string) []byte {
	t.Helper()
	var p []byte
	if _, err := driver.QueryRow(context.Background(), s.drv.Executor(), `SELECT payload FROM ferry_outbox WHERE event_id = $1`, []any{id}, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

// streamCopy reads the broker's stored copy of an event raw, by its
// JetStream sequence (from the outbox row's receipt), without any consumer.
func (s *stack[TTx]) streamCopy(t *testing.T, ev ferry.Event) ferry.Event {
	t.Helper()
	ctx := context.Background()
	m, err := s.ops.Message(ctx, ev.ID.String())
	if err != nil {
		t.Fatal(err)
	}
	st, err := s.js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	for i := uint64(1); i < 100; i++ {
		raw, err := st.GetMsg(ctx, i)
		if err != nil {
			break
		}
		if raw.Header.Get(nats.MsgIdHdr) == m.EventID {
			out := ev
			out.Payload, out.ContentType = raw.Data, raw.Header.Get("content-type")
			return out
		}
	}
	t.Fatalf("event %s not in stream %s", ev.ID, stream)
	return ferry.Event{}
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

func (s *stack[TTx]) parked(t *testing.T, consumer string) map[string]ops.ParkedMessage {
	t.Helper()
	ps, err := s.ops.ListParked(context.Background(), ops.ParkedFilter{Consumer: consumer})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]ops.ParkedMessage{}
	for _, p := range ps {
		out[p.EventID] = p
	}
	return out
}

func TestEncryptionEndToEndSQLite(t *testing.T) {
	db, _ := testenv.NewSQLite(t)
	drv := sqlite.New(db)
	endToEnd(t, newStack(t, drv, drv))
}

func TestEncryptionEndToEndMySQL(t *testing.T) {
	d := testenv.NewMySQLDatabase(t)
	drv := mysql.New(d.DB)
	endToEnd(t, newStack(t, drv, drv))
}

func TestEncryptionEndToEndPostgres(t *testing.T) {
	s := testenv.NewPostgresSchema(t)
	drv := pgxv5.New(s.Pool)
	endToEnd(t, newStack(t, drv, drv))
}

// endToEnd: rotation with old and new keys live, a wrong key parks,
// erasure makes the outbox row and the stream copy unrecoverable, and a
// consumer meeting the erased event parks it (reason decrypt) and goes on.
func endToEnd[TTx any](t *testing.T, s *stack[TTx]) {
	ctx := context.Background()
	payload := func(n string) []byte { return []byte(`{"email":"` + canary + `","n":"` + n + `"}`) }
	ins := func(w *outbox.Writer[TTx], ev ferry.Event) ferry.Event {
		t.Helper()
		out, err := w.Insert(ctx, ev)
		if err != nil {
			t.Fatal(err)
		}
		return out[0]
	}
	// Before rotation: k1 is current.
	old := s.writer(t, "k1")
	order1 := ins(old, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: "o-1", EventType: "order.created", SchemaVersion: 1, Payload: payload("o1")})
	cust := ins(old, ferry.Event{TenantID: "acme", AggregateType: "customer", AggregateID: subject42, EventType: "customer.updated", SchemaVersion: 1, Payload: payload("c1")})
	// After rotation: k2 is current, k1 kept; no row is rewritten.
	order2 := ins(s.writer(t, "k1+k2"), ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: "o-2", EventType: "order.created", SchemaVersion: 1, Payload: payload("o2")})
	if h, _ := encrypt.Inspect(order2.Payload); h.KeyID != "k2" {
		t.Fatalf("order2 wrapped under %q, want k2", h.KeyID)
	}

	// The outbox rows hold envelopes, not the plaintext.
	for _, ev := range []ferry.Event{order1, cust, order2} {
		if p := s.outboxPayload(t, ev.ID.String()); bytes.Contains(p, []byte(canary)) || !encrypt.IsEnvelope(p) {
			t.Fatalf("outbox row of %s holds plaintext or no envelope", ev.EventType)
		}
	}

	// A consumer with both keys sees every plaintext, content type restored.
	billing, billingInbox := s.consume(t, "billing", "k1+k2")
	for _, ev := range []ferry.Event{order1, cust, order2} {
		waitUntil(t, "billing applies "+ev.EventType, func() bool { _, ok := billing.get(ev.ID.String()); return ok })
		got, _ := billing.get(ev.ID.String())
		if !bytes.Contains(got.Payload, []byte(canary)) || got.ContentType != "application/json" {
			t.Fatalf("billing got %q (%s) for %s", got.Payload, got.ContentType, ev.EventType)
		}
	}

	// A consumer whose k1 is wrong parks order1 (decrypt), applies order2.
	wrong, _ := s.consume(t, "wrongkey", "wrong")
	waitUntil(t, "wrongkey applies order2", func() bool { _, ok := wrong.get(order2.ID.String()); return ok })
	waitUntil(t, "wrongkey parks order1", func() bool { _, ok := s.parked(t, "wrongkey")[order1.ID.String()]; return ok })
	if p := s.parked(t, "wrongkey")[order1.ID.String()]; p.Reason != "decrypt" || strings.Contains(p.LastError, canary) {
		t.Fatalf("wrongkey parked %+v", p)
	}
	if _, ok := wrong.get(order1.ID.String()); ok {
		t.Fatal("the wrong key's handler saw order1")
	}
	// Replayable once the key is back: the same consumer with the wrong
	// key keeps it parked (control); with the right key it applies.
	parkedID := s.parked(t, "wrongkey")[order1.ID.String()].ID
	stillWrong, _ := s.newInbox(t, "wrongkey", "wrong")
	if rs, err := stillWrong.Replay(ctx, parkedID); err != nil || len(rs) != 1 || rs[0].Outcome != inbox.OutcomeParked || rs[0].Reason != inbox.ReasonDecrypt {
		t.Fatalf("replay with the wrong key: %+v %v", rs, err)
	}
	fixed, fixedSeen := s.newInbox(t, "wrongkey", "k1+k2")
	if rs, err := fixed.Replay(ctx, parkedID); err != nil || len(rs) != 1 || rs[0].Outcome != inbox.OutcomeApplied {
		t.Fatalf("replay with the right key: %+v %v", rs, err)
	}
	if got, ok := fixedSeen.get(order1.ID.String()); !ok || !bytes.Contains(got.Payload, []byte(canary)) {
		t.Fatalf("replayed handler saw %q", got.Payload)
	}

	// The stream copy: encrypted, and opens before erasure (control).
	opener, err := encrypt.New(s.rings["k1+k2"], append(rules(), encrypt.WithSubjectKeyStore(s.drv.Executor()))...)
	if err != nil {
		t.Fatal(err)
	}
	copyBefore := s.streamCopy(t, cust)
	if bytes.Contains(copyBefore.Payload, []byte(canary)) || copyBefore.ContentType != encrypt.ContentType {
		t.Fatalf("stream copy holds plaintext or says %q", copyBefore.ContentType)
	}
	if got, err := opener.Open(ctx, copyBefore); err != nil || !bytes.Contains(got.Payload, []byte(canary)) {
		t.Fatalf("stream copy before erasure: %v", err)
	}
	// The relay marks the row after the broker's ack, so a consumer can
	// apply the event (and the stream hold it) before the row says sent
	// (a CI run reached the check after erasure with the row pending):
	// wait for the mark, so that check looks at a sent row.
	waitUntil(t, "the relay to mark the customer event sent", func() bool {
		m, err := s.ops.Message(ctx, cust.ID.String())
		return err == nil && m.Status == "sent"
	})
	// The subject's wrapped key, to look for it after erasure.
	var wrapped []byte
	if _, err := driver.QueryRow(ctx, s.drv.Executor(), `SELECT wrapped_key FROM ferry_subject_keys WHERE subject = $1`, []any{subject42}, &wrapped); err != nil || len(wrapped) == 0 {
		t.Fatalf("subject key: %v", err)
	}

	// ferry erase: preview, refused without a reason, then approved.
	req := ops.EraseRequest{TenantID: "acme", Subject: subject42}
	pre, err := s.ops.EraseSubject(ctx, req, ops.Approval{})
	if err != nil || !pre.DryRun || pre.Rows != 1 {
		t.Fatalf("preview %+v %v", pre, err)
	}
	if _, err := s.ops.EraseSubject(ctx, req, ops.Approval{Approve: true, Actor: "dpo"}); !errors.Is(err, ops.ErrReasonRequired) {
		t.Fatalf("no reason: %v", err)
	}
	if got, err := opener.Open(ctx, copyBefore); err != nil || !bytes.Contains(got.Payload, []byte(canary)) {
		t.Fatalf("a preview must not erase: %v", err)
	}
	res, err := s.ops.EraseSubject(ctx, req, ops.Approval{Approve: true, Actor: "dpo", Reason: "GDPR art. 17 request #991"})
	if err != nil || res.Rows != 1 || res.AuditID == 0 {
		t.Fatalf("erase %+v %v", res, err)
	}
	if _, err := s.ops.EraseSubject(ctx, req, ops.Approval{Approve: true, Actor: "dpo", Reason: "again"}); !errors.Is(err, ops.ErrNotFound) {
		t.Fatalf("second erase: %v, want ErrNotFound", err)
	}

	// Unrecoverable from the outbox row and from the stream copy.
	row := cust
	row.Payload, row.ContentType = s.outboxPayload(t, cust.ID.String()), encrypt.ContentType
	for name, ev := range map[string]ferry.Event{"outbox row": row, "stream copy": s.streamCopy(t, cust)} {
		if _, err := opener.Open(ctx, ev); !errors.Is(err, encrypt.ErrSubjectErased) {
			t.Fatalf("%s after erasure: %v, want ErrSubjectErased", name, err)
		}
		if bytes.Contains(ev.Payload, []byte(canary)) {
			t.Fatalf("%s holds plaintext", name)
		}
	}
	// Neither the key nor the subject's name is left in the key table;
	// the audit row names the digest, not the subject.
	var n int64
	if _, err := driver.QueryRow(ctx, s.drv.Executor(), `SELECT count(*) FROM ferry_subject_keys WHERE wrapped_key IS NOT NULL OR subject = $1`, []any{subject42}, &n); err != nil || n != 0 {
		t.Fatalf("key table after erasure: %d rows with a key or the name (%v)", n, err)
	}
	audit, err := s.ops.Audit(ctx, 5)
	if err != nil || len(audit) == 0 || audit[0].Action != ops.ActionEraseSubject || strings.Contains(audit[0].Filter, subject42) ||
		!strings.Contains(audit[0].Filter, encrypt.SubjectDigest("acme", subject42)) {
		t.Fatalf("audit %+v %v", audit, err)
	}
	// Event ids, sequences and receipts stay: the row is still sent with its receipt.
	m, err := s.ops.Message(ctx, cust.ID.String())
	if err != nil || m.Status != "sent" || m.BrokerReceipt == "" || m.AggregateSeq != 1 {
		t.Fatalf("evidence after erasure: %+v %v", m, err)
	}

	// A consumer reading the stream after erasure parks the erased event
	// (reason decrypt), applies the others, and keeps running.
	// Dedup still works on erased events: the relay republishes the erased
	// event (a replay past the stream's duplicate window) and billing,
	// which applied it before the erasure, absorbs it as a duplicate
	// instead of parking it.
	time.Sleep(dupWindow + 100*time.Millisecond)
	dups := billingInbox.Stats().Duplicates
	if r, err := s.ops.Replay(ctx, ops.Filter{EventIDs: []string{cust.ID.String()}}, ops.Approval{Approve: true, Actor: "t", Reason: "redeliver"}); err != nil || r.Rows != 1 {
		t.Fatalf("replay: %+v %v", r, err)
	}
	waitUntil(t, "billing absorbs the republished erased event", func() bool { return billingInbox.Stats().Duplicates > dups })
	if p, ok := s.parked(t, "billing")[cust.ID.String()]; ok {
		t.Fatalf("billing parked the duplicate of an erased event: %+v", p)
	}

	late, _ := s.consume(t, "latecomer", "k1+k2")
	waitUntil(t, "latecomer parks the erased event", func() bool { _, ok := s.parked(t, "latecomer")[cust.ID.String()]; return ok })
	p := s.parked(t, "latecomer")[cust.ID.String()]
	if p.Reason != "decrypt" || !strings.Contains(p.LastError, "erased") {
		t.Fatalf("latecomer parked %+v", p)
	}
	for _, ev := range []ferry.Event{order1, order2} {
		waitUntil(t, "latecomer applies "+ev.EventType, func() bool { _, ok := late.get(ev.ID.String()); return ok })
	}
	// A later event of the same subject gets a new key and is readable.
	cust2 := ins(s.writer(t, "k1+k2"), ferry.Event{TenantID: "acme", AggregateType: "customer", AggregateID: subject42, EventType: "customer.updated", SchemaVersion: 1, Payload: payload("c2")})
	waitUntil(t, "latecomer applies the new subject event", func() bool { _, ok := late.get(cust2.ID.String()); return ok })
	if h1, _ := encrypt.Inspect(cust.Payload); func() bool { h2, _ := encrypt.Inspect(cust2.Payload); return h1.KeyID == h2.KeyID }() {
		t.Fatal("the new event reused the erased key's handle")
	}

	// And from the archive: cleanup --archive copies the erased row (made
	// old enough) to a blob store; the archived payload is the envelope,
	// which does not open, and no archived byte holds the plaintext.
	longAgo := time.Now().UTC().Add(-300 * time.Hour)
	if _, err := s.drv.Executor().Exec(ctx, `UPDATE ferry_outbox SET published_at = $1 WHERE event_id = $2`, longAgo, cust.ID.String()); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, err := archive.Open(ctx, "file://"+dir+"?create_dir=1")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cr, err := s.ops.Cleanup(ctx, ops.CleanupOptions{Retention: 240 * time.Hour, Archive: st}, ops.Approval{Approve: true, Actor: "t", Reason: "archive"})
	if err != nil || cr.Outbox != 1 || cr.Archived < 1 {
		t.Fatalf("cleanup --archive: %+v %v", cr, err)
	}
	var archived []byte
	for b, err := range st.Batches(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		if b.Table != "outbox" {
			continue
		}
		for _, row := range b.Rows {
			var rowEv ferry.Event
			for i, c := range b.Columns {
				switch c.Name {
				case "event_id":
					if fmt.Sprint(row[i]) == cust.ID.String() {
						rowEv = cust
					}
				case "payload":
					archived, _ = row[i].([]byte)
				}
			}
			if rowEv.ID == cust.ID {
				rowEv.Payload, rowEv.ContentType = archived, encrypt.ContentType
				if _, err := opener.Open(ctx, rowEv); !errors.Is(err, encrypt.ErrSubjectErased) {
					t.Fatalf("archived copy after erasure: %v, want ErrSubjectErased", err)
				}
				archived = append([]byte(nil), archived...)
				goto found
			}
		}
	}
	t.Fatal("erased event not in the archive")
found:
	if !encrypt.IsEnvelope(archived) || bytes.Contains(archived, []byte(canary)) {
		t.Fatal("archived payload is not the envelope")
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*", "*"))
	for _, f := range files {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if zr, err := gzip.NewReader(bytes.NewReader(raw)); err == nil {
			if raw, err = io.ReadAll(zr); err != nil {
				t.Fatal(err)
			}
		}
		if bytes.Contains(raw, []byte(canary)) {
			t.Fatalf("archive file %s holds the plaintext", f)
		}
	}
}
