package cdc

import (
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pglogrepl"

	"github.com/ferryhq/ferry"
)

// ErrDecode marks a replication message the relay cannot turn into an event.
// It stops the session (the LSN stays where it was): skipping a row would be
// a silent loss.
var ErrDecode = errors.New("cdc: cannot decode replicated row")

// relation maps pgoutput column positions to outbox columns. pgoutput sends
// a RelationMessage before the first row of a relation in each session and
// again after the table's definition changed, so positions are never
// assumed, always looked up by name.
type relation struct {
	id    uint32
	index map[string]int
}

func newRelation(m *pglogrepl.RelationMessage) *relation {
	r := &relation{id: m.RelationID, index: make(map[string]int, len(m.Columns))}
	for i, c := range m.Columns {
		r.index[c.Name] = i
	}
	return r
}

// requiredColumns are read from every insert; a relation lacking one is not
// a Ferry outbox table.
var requiredColumns = []string{"event_id", "tenant_id", "aggregate_type", "aggregate_id", "aggregate_seq",
	"event_type", "schema_version", "topic", "shard", "content_type", "payload", "occurred_at"}

func (r *relation) check() error {
	for _, c := range requiredColumns {
		if _, ok := r.index[c]; !ok {
			return fmt.Errorf("%w: relation %d has no column %q", ErrDecode, r.id, c)
		}
	}
	return nil
}

// decodeInsert turns one replicated outbox row (text format) into an event.
// Errors name the column, never its value (payload bytes stay out of logs).
func (r *relation) decodeInsert(t *pglogrepl.TupleData) (ferry.Event, error) {
	var e ferry.Event
	if t == nil {
		return e, fmt.Errorf("%w: insert without tuple", ErrDecode)
	}
	col := func(name string) (string, bool, error) { return r.column(t, name) }
	text := func(name string, dst *string) error {
		v, _, err := col(name)
		*dst = v
		return err
	}
	var err error
	var s string
	if s, _, err = col("event_id"); err != nil {
		return e, err
	}
	if e.ID, err = uuid.Parse(s); err != nil {
		return e, fmt.Errorf("%w: event_id: %w", ErrDecode, err)
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{
		{"tenant_id", &e.TenantID}, {"aggregate_type", &e.AggregateType}, {"aggregate_id", &e.AggregateID},
		{"event_type", &e.EventType}, {"topic", &e.Topic}, {"content_type", &e.ContentType},
		{"traceparent", &e.Headers.Traceparent}, {"correlation_id", &e.Headers.CorrelationID},
		{"causation_id", &e.Headers.CausationID}, {"principal", &e.Headers.Principal},
		{"action", &e.Headers.Action}, {"target", &e.Headers.Target},
	} {
		if err := text(f.name, f.dst); err != nil {
			return e, err
		}
	}
	ints := []struct {
		name string
		bits int
		set  func(int64)
	}{
		{"aggregate_seq", 64, func(v int64) { e.AggregateSeq = v }},
		{"schema_version", 32, func(v int64) { e.SchemaVersion = int(v) }},
		{"shard", 32, func(v int64) { e.Shard = int(v) }},
	}
	for _, f := range ints {
		s, ok, err := col(f.name)
		if err != nil {
			return e, err
		}
		if !ok {
			return e, fmt.Errorf("%w: %s is null", ErrDecode, f.name)
		}
		v, err := strconv.ParseInt(s, 10, f.bits)
		if err != nil {
			return e, fmt.Errorf("%w: %s: not an integer", ErrDecode, f.name)
		}
		f.set(v)
	}
	if s, _, err = col("payload"); err != nil {
		return e, err
	}
	if e.Payload, err = decodeByteaHex(s); err != nil {
		return e, fmt.Errorf("%w: payload: %w", ErrDecode, err)
	}
	if s, _, err = col("occurred_at"); err != nil {
		return e, err
	}
	if e.OccurredAt, err = parseTimestamptz(s); err != nil {
		return e, fmt.Errorf("%w: occurred_at: %w", ErrDecode, err)
	}
	return e, nil
}

// column is one column's text value; ok is false when the relation has
// no such column or the value is NULL.
func (r *relation) column(t *pglogrepl.TupleData, name string) (v string, ok bool, err error) {
	i, ok := r.index[name]
	if !ok {
		return "", false, nil
	}
	if i >= len(t.Columns) {
		return "", false, fmt.Errorf("%w: column %s missing from tuple", ErrDecode, name)
	}
	c := t.Columns[i]
	switch c.DataType {
	case pglogrepl.TupleDataTypeText:
		return string(c.Data), true, nil
	case pglogrepl.TupleDataTypeNull:
		return "", false, nil
	default:
		return "", false, fmt.Errorf("%w: column %s has tuple data type %q, want text", ErrDecode, name, c.DataType)
	}
}

// createdAt is the row's created_at: the partition key of a partitioned
// outbox, with which its mark is pruned to the row's partition.
func (r *relation) createdAt(t *pglogrepl.TupleData) (time.Time, error) {
	s, ok, err := r.column(t, "created_at")
	if err != nil {
		return time.Time{}, err
	}
	if !ok {
		return time.Time{}, fmt.Errorf("%w: created_at is null", ErrDecode)
	}
	ts, err := parseTimestamptz(s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: created_at: %w", ErrDecode, err)
	}
	return ts, nil
}

// decodeByteaHex parses bytea's hex text form ("\x0a0b…"). The replication
// session sets bytea_output=hex, so the legacy escape form never appears.
func decodeByteaHex(s string) ([]byte, error) {
	if !strings.HasPrefix(s, `\x`) {
		return nil, errors.New(`bytea not in hex form (want \x…)`)
	}
	b, err := hex.DecodeString(s[2:])
	if err != nil {
		return nil, errors.New("bytea: invalid hex")
	}
	return b, nil
}

// timestamptz text forms under DateStyle=ISO (set for the replication
// session); the zone offset may carry minutes and seconds.
var tsLayouts = []string{
	"2006-01-02 15:04:05.999999999-07",
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999-07:00:00",
}

func parseTimestamptz(s string) (time.Time, error) {
	for _, l := range tsLayouts {
		if t, err := time.Parse(l, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("timestamptz %q not in ISO form", truncate(s, 40))
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
