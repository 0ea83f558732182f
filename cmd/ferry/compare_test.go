package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

// TestCompareCommand: on the real NATS server, a production stream that lost
// two of ten events and a shadow stream with all ten: ferry compare reports
// exactly those two missing and exits 1; a stream against itself is clean.
func TestCompareCommand(t *testing.T) {
	url := testenv.NATSURL(t)
	ctx := context.Background()
	nc, err := natsjs.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	sfx := strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	prod, sh := "CMPTEST_P_"+sfx, "CMPTEST_S_"+sfx
	subj := "cmptest." + sfx
	for name, s := range map[string]string{prod: subj, sh: "shadow." + subj} {
		if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: name, Subjects: []string{s}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	}
	for i := 1; i <= 10; i++ {
		id := uuid.NewString()
		m := &nats.Msg{Subject: "shadow." + subj, Data: fmt.Appendf(nil, `{"n":%d}`, i), Header: nats.Header{"ce-id": []string{id}}}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
		if i == 3 || i == 8 {
			continue // lost by the old path
		}
		m = &nats.Msg{Subject: subj, Data: fmt.Appendf(nil, `{"n": %d}`, i), Header: nats.Header{"ce-id": []string{id}}}
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	out, err := runFerry(t, "compare", "--nats-url", url, "--production-stream", prod, "--shadow-stream", sh)
	var ec exitCodeError
	if !errors.As(err, &ec) || ec.code != 1 {
		t.Fatalf("err = %v, want exit 1; output:\n%s", err, out)
	}
	for _, want := range []string{"production 8 messages, shadow 10", "missing (lost by the old path)  2 ", "extra (old path only)           0", "differing                       0", "reordered                       0"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if out, err := runFerry(t, "compare", "--nats-url", url, "--production-stream", sh, "--shadow-stream", sh, "--key", "json:/n"); err != nil {
		t.Errorf("a stream against itself: %v\n%s", err, out)
	}
	if _, err := runFerry(t, "compare", "--nats-url", url, "--production-stream", prod, "--shadow-stream", sh, "--key", "nope"); err == nil || !strings.Contains(err.Error(), "--key") {
		t.Errorf("bad key: %v", err)
	}
}

// TestRelayShadowPrefix runs `ferry relay --shadow-subject-prefix shadow.`
// on SQLite and the real NATS server: every outbox event lands on
// shadow.<topic> in the shadow stream, none on the production subject, and
// the rows are marked sent.
func TestRelayShadowPrefix(t *testing.T) {
	url := testenv.NATSURL(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc, err := natsjs.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	sfx := strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	topic := "shadowrelay." + sfx + ".orders"
	prod, sh := "SHRELAY_P_"+sfx, "SHRELAY_S_"+sfx
	for name, s := range map[string]string{prod: topic, sh: "shadow." + topic} {
		if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: name, Subjects: []string{s}}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	}
	db, path := testenv.NewSQLite(t)
	drv := sqlite.New(db)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		t.Fatal(err)
	}
	w, err := outbox.New(drv)
	if err != nil {
		t.Fatal(err)
	}
	const n = 12
	for i := 0; i < n; i++ {
		if _, err := w.Insert(ctx, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: fmt.Sprint("o-", i), EventType: "order.created", SchemaVersion: 1, Topic: topic, Payload: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		root := newRootCmd()
		var out strings.Builder
		root.SetOut(&out)
		root.SetErr(&out)
		root.SetArgs([]string{"relay", "--database-url", "sqlite:" + path, "--broker-url", url, "--stream", sh, "--subjects", "shadow." + topic,
			"--shadow-subject-prefix", "shadow.", "--listen", "", "--poll-interval", "20ms"})
		err := root.ExecuteContext(runCtx)
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, out.String())
		}
		done <- err
	}()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var sent int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM ferry_outbox WHERE status = 'sent'`).Scan(&sent); err != nil {
			t.Fatal(err)
		}
		if sent == n {
			break
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("relay marked %d of %d sent: %v", sent, n, <-done)
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("relay: %v", err)
	}
	for name, want := range map[string]uint64{sh: n, prod: 0} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs != want {
			t.Errorf("stream %s has %d messages, want %d", name, info.State.Msgs, want)
		}
	}
}
