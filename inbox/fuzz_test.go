package inbox

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/databasesql"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/testenv"
)

// FuzzFingerprint: the canonical envelope is injective on the fields it
// covers (length-prefixed), stable, and never panics.
func FuzzFingerprint(f *testing.F) {
	f.Add("acme", "order", "o1", int64(1), "order.created", 1, "application/json", []byte(`{}`), "order", "o", "1o")
	f.Add("a", "b", "", int64(-1), "", 0, "", []byte{0, 1}, "ab", "", "")
	f.Fuzz(func(t *testing.T, tenant, aggType, aggID string, seq int64, evType string, ver int, ct string, payload []byte, aggType2, aggID2, ct2 string) {
		id := uuid.MustParse("01900000-0000-7000-8000-000000000001")
		a := ferry.Event{ID: id, TenantID: tenant, AggregateType: aggType, AggregateID: aggID, AggregateSeq: seq,
			EventType: evType, SchemaVersion: ver, ContentType: ct, Payload: payload}
		b := a
		b.AggregateType, b.AggregateID, b.ContentType = aggType2, aggID2, ct2
		fa, fb := Fingerprint(a), Fingerprint(b)
		if fa != Fingerprint(a) {
			t.Fatal("fingerprint not stable")
		}
		same := aggType == aggType2 && aggID == aggID2 && ct == ct2
		if same != (fa == fb) {
			t.Fatalf("fingerprint equality %v for envelopes equal=%v (%q/%q vs %q/%q)", fa == fb, same, aggType, aggID, aggType2, aggID2)
		}
		// Headers and times do not take part.
		c := a
		c.Headers.Traceparent, c.OccurredAt, c.Topic = "x", time.Unix(1, 0), "t"
		if Fingerprint(c) != fa {
			t.Fatal("headers changed the fingerprint")
		}
	})
}

// FuzzParkArbitraryMessage: whatever a broker hands over — undecodable
// garbage, or a "decoded" event with hostile field values — the inbox
// parks or applies it and acks, never panics and never fails the
// transaction (a message that fails forever would block its worker).
func FuzzParkArbitraryMessage(f *testing.F) {
	db, err := sqlite.Open(f.TempDir() + "/fuzz.db")
	if err != nil {
		f.Fatal(err)
	}
	defer db.Close()
	drv := sqlite.New(db)
	setupStore(f, drv, db)
	var pgDrv *databasesql.Driver
	if testenv.Reachable(testenv.URL("FERRY_TEST_POSTGRES_URL", testenv.DefaultPostgresURL)) == nil {
		pg := testenv.NewPostgresSchema(f)
		pdb := pg.OpenSQL(f)
		pgDrv = databasesql.New(pdb, driver.Postgres)
		setupStore(f, pgDrv, pdb)
	}
	f.Add(true, "order.events", "k", "ce-id", "x", []byte("body"), "acme", "order", "o1", int64(1), "order.created", 1, "application/json", "user")
	f.Add(false, "", "", "", "", []byte{}, "t\x00", "\xff", "", int64(0), "", -5, "", "")
	f.Add(false, "d", "k", "h", "\xfe\xff", []byte{0xff}, "acme", "order", "o1", int64(9), "e", 1<<30+1, "a/b", "p\x00")
	f.Fuzz(func(t *testing.T, undecodable bool, dest, key, hk, hv string, body []byte,
		tenant, aggType, aggID string, seq int64, evType string, ver int, ct, principal string) {
		d := &broker.Delivery{
			Raw: broker.RawMessage{Destination: dest, Key: key, Headers: map[string]string{hk: hv}, Body: body},
		}
		if undecodable {
			d.DecodeErr = &ferry.ValidationError{Field: "ce-id", Reason: "missing"}
		} else {
			d.Event = ferry.Event{ID: uuid.New(), TenantID: tenant, AggregateType: aggType, AggregateID: aggID, AggregateSeq: seq,
				EventType: evType, SchemaVersion: ver, ContentType: ct, Payload: body, Headers: ferry.Headers{Principal: principal}}
		}
		for _, dv := range []*databasesql.Driver{drv, pgDrv} {
			if dv == nil {
				continue
			}
			acked := false
			d.Ack = func(context.Context) error { acked = true; return nil }
			d.Nack = func(context.Context, time.Duration) error { return nil }
			// The handler stores no payload text: what is under test is the
			// inbox's own handling, not a handler's encoding choices.
			h := func(ctx context.Context, tx *sql.Tx, ev ferry.Event) error {
				ev.Payload = nil
				return writeEffect(ctx, tx, ev)
			}
			ib, err := New[*sql.Tx](dv, "fuzz", h, WithMaxRawBytes(256), WithStartPolicy(StartAtFirstSeen))
			if err != nil {
				t.Fatal(err)
			}
			if err := ib.process(context.Background(), []*message{newMessage(d)}); err != nil {
				t.Fatalf("%s: %v", dv.Dialect(), err)
			}
			if !acked {
				t.Fatalf("%s: message neither applied nor parked (stats %+v)", dv.Dialect(), ib.Stats())
			}
			// The same message twice in one batch (the bulk path on Postgres).
			acks := 0
			d2 := *d
			d2.Event.ID = uuid.New()
			d2.Ack = func(context.Context) error { acks++; return nil }
			batched, err := New[*sql.Tx](dv, "fuzz-batch", h, WithMaxRawBytes(256), WithStartPolicy(StartAtFirstSeen), WithBatch(4, 0))
			if err != nil {
				t.Fatal(err)
			}
			if err := batched.process(context.Background(), []*message{newMessage(&d2), newMessage(&d2)}); err != nil {
				t.Fatalf("%s batch: %v", dv.Dialect(), err)
			}
			if acks != 2 {
				t.Fatalf("%s batch: %d acks, want 2 (stats %+v)", dv.Dialect(), acks, batched.Stats())
			}
		}
	})
}
