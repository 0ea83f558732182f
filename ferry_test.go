package ferry_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
)

func validEvent() ferry.Event {
	return ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: "o-1", EventType: "order.created", SchemaVersion: 1, Payload: []byte(`{}`)}
}

func TestValidateAcceptsAValidEvent(t *testing.T) {
	e := validEvent()
	e.Headers = ferry.Headers{Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", CorrelationID: "c", Principal: "user:1"}
	if err := (ferry.Limits{}).Validate(0, &e); err != nil {
		t.Fatal(err)
	}
}

func TestValidationErrorNamesFieldAndLimit(t *testing.T) {
	e := validEvent()
	e.Payload = make([]byte, ferry.DefaultMaxPayloadBytes+1)
	err := (ferry.Limits{}).Validate(3, &e)
	var ve *ferry.ValidationError
	if !errors.As(err, &ve) || !errors.Is(err, ferry.ErrInvalidEvent) {
		t.Fatalf("err = %v", err)
	}
	msg := err.Error()
	for _, want := range []string{"event[3].payload", "262145", "262144"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
}

func TestValidationErrorNeverEchoesPayload(t *testing.T) {
	e := validEvent()
	e.Payload = []byte("SECRET-CANARY-" + strings.Repeat("x", 300))
	err := (ferry.Limits{MaxPayloadBytes: 10}).Validate(0, &e)
	if err == nil || strings.Contains(err.Error(), "CANARY") {
		t.Fatalf("err = %v", err)
	}
}

func TestTablesRejectInjection(t *testing.T) {
	for _, tc := range []ferry.Tables{
		{Schema: `public"; DROP TABLE x; --`},
		{Prefix: "ferry; DROP"},
		{Prefix: "Ferry_"},
		{Schema: strings.Repeat("s", 41)},
	} {
		err := tc.Check()
		if !errors.Is(err, ferry.ErrInvalidConfig) {
			t.Errorf("%+v: err = %v, want ErrInvalidConfig", tc, err)
		}
	}
	ok := ferry.Tables{Schema: "app", Prefix: "x_"}
	if err := ok.Check(); err != nil {
		t.Fatal(err)
	}
	if got := ok.Name("outbox"); got != `"app"."x_outbox"` {
		t.Fatalf("Name = %s", got)
	}
}

func TestTopicTemplate(t *testing.T) {
	e := validEvent()
	if got := ferry.TopicTemplate("{tenant_id}.{aggregate_type}.{event_type}").Render(&e); got != "acme.order.order.created" {
		t.Fatalf("render = %q", got)
	}
	if got := ferry.TopicTemplate("").Render(&e); got != "order.events" {
		t.Fatalf("default render = %q", got)
	}
	for tmpl, want := range map[ferry.TopicTemplate]string{
		"{aggregate_type}.events":           "order.events",
		"{aggregate_type}-{aggregate_type}": "order-order",
		"x{tenant_id}y{event_type}z":        "xacmeyorder.createdz",
		"plain":                             "plain",
		"{unknown}.{tenant_id}":             "{unknown}.acme",
		"{":                                 "{",
	} {
		if got := tmpl.Render(&e); got != want {
			t.Errorf("Render(%q) = %q, want %q", tmpl, got, want)
		}
	}
	for _, bad := range []ferry.TopicTemplate{"{aggregate}.events", "a b", "x/{tenant_id}"} {
		if err := bad.Check(); !errors.Is(err, ferry.ErrInvalidConfig) {
			t.Errorf("%q: err = %v", bad, err)
		}
	}
}

// Rows carry their shard: the function must never change between versions.
func TestShardForIsStable(t *testing.T) {
	cases := []struct {
		t, a, id string
		n, want  int
	}{
		{"acme", "order", "o-1", 16, ferry.ShardFor("acme", "order", "o-1", 16)},
	}
	if got := ferry.ShardFor("acme", "order", "o-1", 1); got != 0 {
		t.Fatalf("n=1: %d", got)
	}
	// Golden values pin FNV-1a over "tenant\x00type\x00id".
	golden := map[string]int{"acme/order/o-1": 0, "acme/order/o-1001": 3, "acme/order/o-1002": 6, "globex/order/o-2001": 3}
	for k, want := range golden {
		p := strings.SplitN(k, "/", 3)
		if got := ferry.ShardFor(p[0], p[1], p[2], 16); got != want {
			t.Errorf("ShardFor(%s) = %d, want %d", k, got, want)
		}
	}
	for _, c := range cases {
		if got := ferry.ShardFor(c.t, c.a, c.id, c.n); got != c.want || got < 0 || got >= c.n {
			t.Fatalf("ShardFor = %d", got)
		}
	}
}

func TestTopicRendersAndChecks(t *testing.T) {
	e := validEvent()
	if got, err := ferry.TopicTemplate("").Topic(0, &e); err != nil || got != "order.events" {
		t.Fatalf("default template: %q %v", got, err)
	}
	e.AggregateType = strings.Repeat("a", 200)
	_, err := ferry.TopicTemplate("{tenant_id}.{aggregate_type}.{aggregate_type}").Topic(3, &e)
	var ve *ferry.ValidationError
	if !errors.As(err, &ve) || ve.Index != 3 || ve.Field != "topic" || !errors.Is(err, ferry.ErrInvalidEvent) {
		t.Fatalf("a rendered topic over 249 bytes: %v", err)
	}
}

// FuzzValidate feeds arbitrary field values through validation and
// normalisation: it must never panic, and an accepted event must keep
// satisfying the invariants the store relies on.
func FuzzValidate(f *testing.F) {
	f.Add("acme", "order", "o-1", "order.created", 1, "application/json", []byte(`{}`), "order.events", "", "c-1", int64(0))
	f.Add("", "a/b", "\x00", "", 0, "x", []byte{0xff}, "bad topic", "nope", strings.Repeat("z", 2000), int64(-1))
	f.Add("t.t", "a-b_c", "é", "a:b/c", 9, "text/plain", []byte(nil), "", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "", int64(7))
	f.Fuzz(func(t *testing.T, tenant, aggType, aggID, evType string, version int, ct string, payload []byte, topic, tp, corr string, seq int64) {
		e := ferry.Event{TenantID: tenant, AggregateType: aggType, AggregateID: aggID, EventType: evType, SchemaVersion: version,
			ContentType: ct, Payload: payload, Topic: topic, AggregateSeq: seq, Headers: ferry.Headers{Traceparent: tp, CorrelationID: corr}}
		lim := ferry.Limits{MaxPayloadBytes: 4096}
		err := lim.Validate(0, &e)
		if err != nil {
			if !errors.Is(err, ferry.ErrInvalidEvent) {
				t.Fatalf("error does not match ErrInvalidEvent: %v", err)
			}
			return
		}
		if e.Topic == "" {
			topic, err := ferry.TopicTemplate("{tenant_id}.{aggregate_type}").Topic(0, &e)
			if err != nil {
				// A rendered topic can be too long for valid parts; that
				// must be a clean validation error.
				if !errors.Is(err, ferry.ErrInvalidEvent) {
					t.Fatal(err)
				}
				return
			}
			e.Topic = topic
		}
		e.Shard = ferry.ShardFor(e.TenantID, e.AggregateType, e.AggregateID, 16)
		if e.ID == uuid.Nil {
			e.ID = uuid.Must(ferry.NewEventID())
		}
		if err := lim.Validate(0, &e); err != nil {
			// A rendered topic can be too long for valid parts; that must
			// still be a clean validation error.
			if !errors.Is(err, ferry.ErrInvalidEvent) {
				t.Fatal(err)
			}
			return
		}
		if e.Shard < 0 || e.Shard >= 16 || e.ID.Version() != 7 || len(e.Payload) > 4096 || e.SchemaVersion < 1 {
			t.Fatalf("accepted event breaks invariants: %+v", e)
		}
	})
}
