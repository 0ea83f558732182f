package outbox_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/encrypt"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/outbox"
)

// BenchmarkInsertEncrypted is the producer's cost of payload encryption
// against the plain path, in the same run on the same database: one
// transaction with an Insert call of n events of 512-byte JSON payloads,
// (a) plain, (b) encrypted with a fresh data key per event (wrapped by the
// local keyring), (c) encrypted per subject (10 subjects per call, keys
// read from — and on first use created in — the subject_keys table).
// See docs/PERFORMANCE.md, "Payload encryption".
//
//	go test -run '^$' -bench BenchmarkInsertEncrypted -benchtime 2s ./outbox/
func BenchmarkInsertEncrypted(b *testing.B) {
	b.Run("db=sqlite", func(b *testing.B) {
		db, _ := testenv.NewSQLite(b)
		benchEncrypted(b, sqlite.New(db))
	})
	b.Run("db=postgres", func(b *testing.B) {
		s := testenv.NewPostgresSchema(b)
		benchEncrypted(b, pgxv5.New(s.Pool))
	})
}

func benchEncrypted[TTx any](b *testing.B, drv driver.Driver[TTx]) {
	ctx := context.Background()
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		b.Fatal(err)
	}
	ring, err := encrypt.NewLocalKeyring("k1", map[string][]byte{"k1": bytes.Repeat([]byte{1}, encrypt.KeySize)})
	if err != nil {
		b.Fatal(err)
	}
	codec, err := encrypt.New(ring,
		encrypt.WithEventType("order.event_key", encrypt.Rule{}),
		encrypt.WithEventType("order.subject_key", encrypt.Rule{Subject: encrypt.SubjectFromTarget}))
	if err != nil {
		b.Fatal(err)
	}
	w, err := outbox.New(drv, outbox.WithEncryption(codec))
	if err != nil {
		b.Fatal(err)
	}
	payload := []byte(`{"customer":"c-1","email":"someone@example.com","items":[` + string(bytes.Repeat([]byte(`{"sku":"A-1","qty":1},`), 10)) + `{"sku":"Z"}],"note":"`)
	payload = append(payload, bytes.Repeat([]byte("x"), 512-len(payload)-2)...)
	payload = append(payload, `"}`...)
	for _, n := range []int{1, 100} {
		for _, mode := range []string{"plain", "event_key", "subject_key"} {
			b.Run(fmt.Sprintf("events=%d/%s", n, mode), func(b *testing.B) {
				events := make([]ferry.Event, n)
				for i := range events {
					events[i] = ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", i%4), EventType: "order." + mode,
						SchemaVersion: 1, Payload: payload, Headers: ferry.Headers{Target: fmt.Sprintf("customer/%d", i%10)}}
				}
				var stored int
				for range b.N {
					out, err := w.Insert(ctx, events...)
					if err != nil {
						b.Fatal(err)
					}
					stored = len(out[0].Payload)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/event")
				b.ReportMetric(float64(stored), "stored-bytes/event")
			})
		}
	}
}
