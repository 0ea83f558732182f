package cdc

import (
	"errors"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
)

func TestParseTimestamptz(t *testing.T) {
	want := time.Date(2026, 11, 30, 12, 34, 56, 123456000, time.UTC)
	for _, s := range []string{
		"2026-11-30 12:34:56.123456+00",
		"2026-11-30 18:04:56.123456+05:30",
		"2026-11-30 09:34:56.123456-03:00:00",
	} {
		got, err := parseTimestamptz(s)
		if err != nil || !got.Equal(want) {
			t.Errorf("parseTimestamptz(%q) = %v, %v; want %v", s, got, err, want)
		}
	}
	if got, err := parseTimestamptz("2026-11-30 12:34:56+00"); err != nil || !got.Equal(want.Truncate(time.Second)) {
		t.Errorf("whole seconds: %v, %v", got, err)
	}
	for _, bad := range []string{"", "30/11/2026 12:34", "2026-11-30T12:34:56Z", "infinity"} {
		if _, err := parseTimestamptz(bad); err == nil {
			t.Errorf("parseTimestamptz(%q): want error", bad)
		}
	}
}

func TestDecodeByteaHex(t *testing.T) {
	b, err := decodeByteaHex(`\x00ff5c78`)
	if err != nil || string(b) != "\x00\xff\\x" {
		t.Fatalf("got %q, %v", b, err)
	}
	if b, err := decodeByteaHex(`\x`); err != nil || len(b) != 0 {
		t.Fatalf("empty: %q, %v", b, err)
	}
	for _, bad := range []string{"00ff", `\x0`, `\xzz`, `\001`} {
		if _, err := decodeByteaHex(bad); err == nil {
			t.Errorf("decodeByteaHex(%q): want error", bad)
		}
	}
}

func relationOf(cols ...string) *relation {
	m := &pglogrepl.RelationMessage{RelationID: 7}
	for _, c := range cols {
		m.Columns = append(m.Columns, &pglogrepl.RelationMessageColumn{Name: c})
	}
	return newRelation(m)
}

func tuple(vals ...*string) *pglogrepl.TupleData {
	td := &pglogrepl.TupleData{}
	for _, v := range vals {
		if v == nil {
			td.Columns = append(td.Columns, &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeNull})
			continue
		}
		td.Columns = append(td.Columns, &pglogrepl.TupleDataColumn{DataType: pglogrepl.TupleDataTypeText, Data: []byte(*v)})
	}
	return td
}

func str(s string) *string { return &s }

func TestDecodeInsert(t *testing.T) {
	rel := relationOf(requiredColumns...)
	if err := rel.check(); err != nil {
		t.Fatal(err)
	}
	vals := []*string{str("01a22cb7-0ef2-77a6-871e-440d14ffbb24"), str("acme"), str("order"), str("o-1"), str("7"),
		str("order.created"), str("2"), str("order.events"), str("3"), str("application/json"), str(`\x7b7d`),
		str("2026-11-30 12:00:00.5+00")}
	ev, err := rel.decodeInsert(tuple(vals...))
	if err != nil {
		t.Fatal(err)
	}
	if ev.AggregateSeq != 7 || ev.SchemaVersion != 2 || ev.Shard != 3 || string(ev.Payload) != "{}" || ev.TenantID != "acme" ||
		ev.OccurredAt.Nanosecond() != 500000000 {
		t.Fatalf("decoded %+v", ev)
	}

	// Column order comes from the relation, not from assumptions.
	rev := make([]string, len(requiredColumns))
	revVals := make([]*string, len(vals))
	for i := range requiredColumns {
		rev[len(rev)-1-i] = requiredColumns[i]
		revVals[len(vals)-1-i] = vals[i]
	}
	ev2, err := relationOf(rev...).decodeInsert(tuple(revVals...))
	if err != nil || ev2.ID != ev.ID || ev2.AggregateSeq != 7 {
		t.Fatalf("reversed columns: %+v, %v", ev2, err)
	}

	// Errors name the column and never carry the value.
	bad := append([]*string(nil), vals...)
	bad[4] = str("secret-not-a-number")
	_, err = rel.decodeInsert(tuple(bad...))
	if !errors.Is(err, ErrDecode) || !contains(err.Error(), "aggregate_seq") || contains(err.Error(), "secret") {
		t.Fatalf("bad seq: %v", err)
	}
	bad[4] = nil
	if _, err := rel.decodeInsert(tuple(bad...)); !errors.Is(err, ErrDecode) {
		t.Fatalf("null seq: %v", err)
	}
	if err := relationOf("event_id", "payload").check(); !errors.Is(err, ErrDecode) {
		t.Fatalf("relation without outbox columns: %v", err)
	}
	if _, err := rel.decodeInsert(tuple(vals[:3]...)); !errors.Is(err, ErrDecode) {
		t.Fatalf("short tuple: %v", err)
	}
	if _, err := rel.decodeInsert(nil); !errors.Is(err, ErrDecode) {
		t.Fatalf("nil tuple: %v", err)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func TestBackoffBounded(t *testing.T) {
	b := backoff{min: 10 * time.Millisecond, max: 80 * time.Millisecond}
	for range 100 {
		d := b.next()
		if d < 5*time.Millisecond || d > 80*time.Millisecond {
			t.Fatalf("backoff %v outside [min/2, max]", d)
		}
	}
	if b.cur != 80*time.Millisecond {
		t.Fatalf("backoff did not reach max: %v", b.cur)
	}
}
