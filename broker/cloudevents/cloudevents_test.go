package cloudevents

import (
	"bytes"
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
)

var bindings = []Binding{NATS, Kafka, AMQP}

func fullEvent() ferry.Event {
	return ferry.Event{
		ID:            uuid.MustParse("0190f5c2-7b4e-7cc1-9a1e-1b2c3d4e5f60"),
		TenantID:      "acme",
		AggregateType: "order",
		AggregateID:   "order-42",
		AggregateSeq:  7,
		EventType:     "order.created",
		SchemaVersion: 2,
		ContentType:   "application/json",
		Payload:       []byte(`{"total":12}`),
		OccurredAt:    time.Date(2026, 11, 30, 12, 1, 2, 345678901, time.UTC),
		Topic:         "order.events",
		Headers: ferry.Headers{
			Traceparent:   "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
			CorrelationID: "corr-1",
			CausationID:   "cmd-9",
			Principal:     "user:alice",
			Action:        "order.create",
			Target:        "order/42",
		},
	}
}

func minimalEvent() ferry.Event {
	ev := fullEvent()
	ev.Headers = ferry.Headers{}
	ev.Payload = nil
	return ev
}

// sameEvent compares what the codec carries (everything but Topic and Shard).
func sameEvent(t testing.TB, got, want ferry.Event) {
	t.Helper()
	if !got.OccurredAt.Equal(want.OccurredAt) {
		t.Fatalf("OccurredAt = %v, want %v", got.OccurredAt, want.OccurredAt)
	}
	if !bytes.Equal(got.Payload, want.Payload) {
		t.Fatalf("Payload = %q, want %q", got.Payload, want.Payload)
	}
	got.OccurredAt, want.OccurredAt = time.Time{}, time.Time{}
	got.Payload, want.Payload = nil, nil
	got.Topic, want.Topic = "", ""
	got.Shard, want.Shard = 0, 0
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("event mismatch:\n got %+v\nwant %+v", got, want)
	}
}

func TestEncodeHeaderNames(t *testing.T) {
	ev := fullEvent()
	want := map[Binding]map[string]string{
		NATS: {
			"ce-specversion": "1.0", "ce-id": ev.ID.String(), "ce-source": "ferry://orders", "ce-type": "order.created",
			"ce-subject": "order-42", "ce-time": "2026-11-30T12:01:02.345678901Z", "content-type": "application/json",
			"ce-sequence": "7", "ce-partitionkey": "acme/order/order-42", "ce-tenantid": "acme", "ce-aggregatetype": "order",
			"ce-schemaversion": "2", "ce-traceparent": ev.Headers.Traceparent, "ce-correlationid": "corr-1",
			"ce-causationid": "cmd-9", "ce-principal": "user:alice", "ce-action": "order.create", "ce-target": "order/42",
		},
	}
	want[Kafka] = map[string]string{}
	want[AMQP] = map[string]string{}
	for k, v := range want[NATS] {
		if k == "content-type" {
			want[Kafka][k], want[AMQP][k] = v, v
			continue
		}
		attr := strings.TrimPrefix(k, "ce-")
		want[Kafka]["ce_"+attr] = v
		want[AMQP]["cloudEvents:"+attr] = v
	}
	// The W3C header, unprefixed, beside the extension in every binding.
	for _, b := range bindings {
		want[b][TraceparentHeader] = ev.Headers.Traceparent
	}
	for _, b := range bindings {
		h, body := Encode(b, ev, EncodeOptions{Source: "ferry://orders"})
		if !maps.Equal(h, want[b]) {
			t.Errorf("%s headers:\n got %v\nwant %v", b, h, want[b])
		}
		if !bytes.Equal(body, ev.Payload) {
			t.Errorf("%s body = %q", b, body)
		}
	}
}

func TestEncodeOmitsEmptyOptionalAndDefaults(t *testing.T) {
	ev := minimalEvent()
	ev.ContentType = ""
	h, _ := Encode(NATS, ev, EncodeOptions{})
	for _, k := range []string{"ce-traceparent", "ce-correlationid", "ce-causationid", "ce-principal", "ce-action", "ce-target", "ce-dataschema"} {
		if _, ok := h[k]; ok {
			t.Errorf("%s present for an empty field", k)
		}
	}
	if h["ce-source"] != DefaultSource {
		t.Errorf("source = %q, want default %q", h["ce-source"], DefaultSource)
	}
	if h["content-type"] != ferry.DefaultContentType {
		t.Errorf("content-type = %q, want %q", h["content-type"], ferry.DefaultContentType)
	}
	if _, ok := h["Content-Type"]; ok {
		t.Error("capitalised Content-Type written")
	}
}

func TestRoundTrip(t *testing.T) {
	for _, b := range bindings {
		for name, ev := range map[string]ferry.Event{"full": fullEvent(), "minimal": minimalEvent()} {
			t.Run(b.String()+"/"+name, func(t *testing.T) {
				h, body := Encode(b, ev, EncodeOptions{})
				got, err := Decode(b, h, body)
				if err != nil {
					t.Fatal(err)
				}
				sameEvent(t, got, ev)
			})
		}
	}
}

func TestRoundTripNonUTCTime(t *testing.T) {
	ev := fullEvent()
	ev.OccurredAt = time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("x", 5*3600))
	h, body := Encode(Kafka, ev, EncodeOptions{})
	if h["ce_time"] != "2026-01-01T22:04:05Z" {
		t.Fatalf("time header %q, want UTC", h["ce_time"])
	}
	got, err := Decode(Kafka, h, body)
	if err != nil {
		t.Fatal(err)
	}
	sameEvent(t, got, ev)
}

func TestDecodeCaseInsensitiveFallback(t *testing.T) {
	h, body := Encode(NATS, fullEvent(), EncodeOptions{})
	up := map[string]string{}
	for k, v := range h {
		up[strings.ToUpper(k)] = v
	}
	got, err := Decode(NATS, up, body)
	if err != nil {
		t.Fatal(err)
	}
	sameEvent(t, got, fullEvent())

	h["CE-ID"] = uuid.NewString()
	delete(h, "ce-id")
	h["Ce-Id"] = uuid.NewString()
	if _, err := Decode(NATS, h, body); !isAttrErr(err, AttrID) {
		t.Fatalf("ambiguous ids: err = %v, want DecodeError on id", err)
	}
}

func TestDecodeAMQPUnderscorePrefix(t *testing.T) {
	h, body := Encode(AMQP, fullEvent(), EncodeOptions{})
	alt := map[string]string{}
	for k, v := range h {
		alt[strings.Replace(k, "cloudEvents:", "cloudEvents_", 1)] = v
	}
	got, err := Decode(AMQP, alt, body)
	if err != nil {
		t.Fatal(err)
	}
	sameEvent(t, got, fullEvent())
}

func TestDecodeIgnoresUnknownExtensionsAndNatsMsgID(t *testing.T) {
	h, body := Encode(NATS, fullEvent(), EncodeOptions{})
	h["ce-somethingelse"] = "x"
	h["Nats-Msg-Id"] = "whatever"
	h["ce-dataschema"] = "https://example.com/schema"
	if _, err := Decode(NATS, h, body); err != nil {
		t.Fatal(err)
	}
}

func isAttrErr(err error, attr string) bool {
	var de *DecodeError
	return errors.As(err, &de) && de.Attribute == attr && errors.Is(err, ErrNotCloudEvent)
}

func TestDecodeMalformed(t *testing.T) {
	type mod func(h map[string]string, p string)
	set := func(attr, v string) mod {
		return func(h map[string]string, p string) {
			if attr == AttrDataContentType {
				h[ContentTypeHeader] = v
				return
			}
			h[p+attr] = v
		}
	}
	del := func(attr string) mod {
		return func(h map[string]string, p string) {
			if attr == AttrDataContentType {
				delete(h, ContentTypeHeader)
				return
			}
			delete(h, p+attr)
		}
	}
	cases := []struct {
		name string
		attr string
		m    mod
	}{
		{"specversion missing", AttrSpecVersion, del(AttrSpecVersion)},
		{"specversion 0.3", AttrSpecVersion, set(AttrSpecVersion, "0.3")},
		{"id missing", AttrID, del(AttrID)},
		{"id empty", AttrID, set(AttrID, "")},
		{"id not uuid", AttrID, set(AttrID, "not-a-uuid-at-all-but-36-chars-long!")},
		{"id short", AttrID, set(AttrID, "123")},
		{"id braces", AttrID, set(AttrID, "{0190f5c2-7b4e-7cc1-9a1e-1b2c3d4e5f60}")},
		{"id nil", AttrID, set(AttrID, uuid.Nil.String())},
		{"source missing", AttrSource, del(AttrSource)},
		{"type missing", AttrType, del(AttrType)},
		{"type control char", AttrType, set(AttrType, "order\ncreated")},
		{"subject missing", AttrSubject, del(AttrSubject)},
		{"subject invalid utf8", AttrSubject, set(AttrSubject, "a\xffb")},
		{"time missing", AttrTime, del(AttrTime)},
		{"time not rfc3339", AttrTime, set(AttrTime, "30/11/2026")},
		{"time unix", AttrTime, set(AttrTime, "1764504062")},
		{"time year 10000 utc", AttrTime, set(AttrTime, "9999-12-31T23:00:00-02:00")},
		{"content type missing", AttrDataContentType, del(AttrDataContentType)},
		{"content type DEL char", AttrDataContentType, set(AttrDataContentType, "text/plain\x7f")},
		{"sequence missing", ExtSequence, del(ExtSequence)},
		{"sequence zero", ExtSequence, set(ExtSequence, "0")},
		{"sequence negative", ExtSequence, set(ExtSequence, "-1")},
		{"sequence plus", ExtSequence, set(ExtSequence, "+1")},
		{"sequence leading zero", ExtSequence, set(ExtSequence, "07")},
		{"sequence overflow", ExtSequence, set(ExtSequence, "9223372036854775808")},
		{"sequence hex", ExtSequence, set(ExtSequence, "0x10")},
		{"sequence space", ExtSequence, set(ExtSequence, " 7")},
		{"tenant missing", ExtTenantID, del(ExtTenantID)},
		{"aggregatetype missing", ExtAggregateType, del(ExtAggregateType)},
		{"schemaversion missing", ExtSchemaVersion, del(ExtSchemaVersion)},
		{"schemaversion zero", ExtSchemaVersion, set(ExtSchemaVersion, "0")},
		{"schemaversion text", ExtSchemaVersion, set(ExtSchemaVersion, "v2")},
		{"partitionkey mismatch", ExtPartitionKey, set(ExtPartitionKey, "other/order/order-42")},
		{"traceparent control char", ExtTraceparent, set(ExtTraceparent, "00-\x00")},
		{"correlationid invalid utf8", ExtCorrelationID, set(ExtCorrelationID, "\xc3")},
		{"causationid control char", ExtCausationID, set(ExtCausationID, "a\tb")},
		{"principal control char", ExtPrincipal, set(ExtPrincipal, "\r")},
		{"action control char", ExtAction, set(ExtAction, "\x1b[31m")},
		{"target invalid utf8", ExtTarget, set(ExtTarget, "\xed\xa0\x80")},
		{"dataschema control char", AttrDataSchema, set(AttrDataSchema, "http://x/\n")},
	}
	for _, b := range bindings {
		for _, c := range cases {
			t.Run(b.String()+"/"+c.name, func(t *testing.T) {
				h, body := Encode(b, fullEvent(), EncodeOptions{})
				c.m(h, b.Prefix())
				ev, err := Decode(b, h, body)
				if !isAttrErr(err, c.attr) {
					t.Fatalf("err = %v, want *DecodeError for %s", err, c.attr)
				}
				if ev.Payload != nil {
					t.Error("payload returned with an error")
				}
				if strings.Contains(err.Error(), string(body)) {
					t.Error("error message contains the body")
				}
			})
		}
	}
}

func TestDecodeNotCloudEvent(t *testing.T) {
	for _, h := range []map[string]string{nil, {}, {"content-type": "application/json"}, {"content-type": "application/cloudevents+json"}} {
		_, err := Decode(NATS, h, []byte(`{"specversion":"1.0"}`))
		if !errors.Is(err, ErrNotCloudEvent) || !isAttrErr(err, AttrSpecVersion) {
			t.Errorf("headers %v: err = %v, want ErrNotCloudEvent on specversion", h, err)
		}
	}
	if _, err := Decode(Binding(0), map[string]string{}, nil); !errors.Is(err, ErrNotCloudEvent) {
		t.Errorf("undefined binding: err = %v", err)
	}
	if _, err := Decode(Kafka, map[string]string{"ce-specversion": "1.0"}, nil); !isAttrErr(err, AttrSpecVersion) {
		t.Errorf("NATS header on Kafka binding accepted: %v", err)
	}
}

func TestEncodePanicsOnUndefinedBinding(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic for undefined binding")
		}
	}()
	Encode(Binding(9), fullEvent(), EncodeOptions{})
}

func TestBindingHelpers(t *testing.T) {
	if NATS.Header(AttrID) != "ce-id" || Kafka.Header(ExtSequence) != "ce_sequence" ||
		AMQP.Header(AttrType) != "cloudEvents:type" || AMQP.Header(AttrDataContentType) != "content-type" {
		t.Fatal("Header names wrong")
	}
	if Binding(0).Valid() || Binding(4).Valid() || !AMQP.Valid() {
		t.Fatal("Valid wrong")
	}
}

// multi turns a codec map into the multi-valued form NATS and Kafka deliver.
func multi(h map[string]string) map[string][]string {
	m := make(map[string][]string, len(h))
	for k, v := range h {
		m[k] = []string{v}
	}
	return m
}

func TestDecodeMultiSingleValuedIsDecode(t *testing.T) {
	for _, b := range bindings {
		h, body := Encode(b, fullEvent(), EncodeOptions{})
		ev, flat, err := DecodeMulti(b, multi(h), body)
		if err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		sameEvent(t, ev, fullEvent())
		if !maps.Equal(flat, h) {
			t.Fatalf("%s: flat %v, want %v", b, flat, h)
		}
	}
}

// A CloudEvents attribute given twice is ambiguous, whatever the values
// (equal ones too) and whatever the case of the repeated name; the error
// names the attribute and the header, and flat keeps every value.
func TestDecodeMultiRepeatedAttribute(t *testing.T) {
	for _, b := range []Binding{NATS, Kafka} {
		for _, tc := range []struct {
			header, attr string
			values       []string
		}{
			{b.Prefix() + ExtTenantID, ExtTenantID, []string{"acme", "victim"}},
			{b.Prefix() + AttrID, AttrID, []string{fullEvent().ID.String(), fullEvent().ID.String()}},
			{ContentTypeHeader, AttrDataContentType, []string{"application/json", "text/plain"}},
			{strings.ToUpper(b.Prefix() + ExtSequence), ExtSequence, []string{"7", "8", "9"}},
			{b.Prefix() + "someextension", "someextension", []string{"a", "b"}},
		} {
			h, body := Encode(b, fullEvent(), EncodeOptions{})
			m := multi(h)
			if tc.header != strings.ToLower(tc.header) {
				delete(m, strings.ToLower(tc.header))
			}
			m[tc.header] = tc.values
			ev, flat, err := DecodeMulti(b, m, body)
			var de *DecodeError
			if !errors.As(err, &de) || de.Attribute != tc.attr || de.Header != tc.header || !errors.Is(err, ErrNotCloudEvent) {
				t.Fatalf("%s %s repeated: err = %v, want a DecodeError naming %s", b, tc.header, err, tc.attr)
			}
			if !strings.Contains(err.Error(), "attribute "+tc.attr) || !strings.Contains(err.Error(), "values") {
				t.Fatalf("error text %q", err)
			}
			if !reflect.DeepEqual(ev, ferry.Event{}) {
				t.Fatal("event returned with the error")
			}
			if flat[tc.header] != strings.Join(tc.values, ", ") {
				t.Fatalf("flat[%s] = %q, want every value", tc.header, flat[tc.header])
			}
		}
	}
}

func TestDecodeMultiRepeatedOtherHeader(t *testing.T) {
	h, body := Encode(NATS, fullEvent(), EncodeOptions{})
	m := multi(h)
	m["x-app-tag"] = []string{"one", "two"}
	m["Nats-Msg-Id"] = []string{"a", "b"}
	m["empty"] = nil
	ev, flat, err := DecodeMulti(NATS, m, body)
	if err != nil {
		t.Fatal(err)
	}
	sameEvent(t, ev, fullEvent())
	if flat["x-app-tag"] != "one, two" {
		t.Fatalf("flat = %v", flat)
	}
	if _, ok := flat["empty"]; ok {
		t.Fatal("a header without values appears in flat")
	}
	// Two repeated attributes: the first in name order is named, every time.
	m[NATS.Prefix()+ExtTenantID] = []string{"a", "b"}
	m[NATS.Prefix()+ExtAction] = []string{"a", "b"}
	for range 20 {
		_, _, err := DecodeMulti(NATS, m, body)
		if !isAttrErr(err, ExtAction) {
			t.Fatalf("err = %v, want action named first", err)
		}
	}
}

// An attribute given twice under names differing only in case is as
// ambiguous as a repeated header: the exact-case value must not win
// silently over the other.
func TestDecodeCaseVariantWithExactMatchIsAmbiguous(t *testing.T) {
	for _, b := range bindings {
		h, body := Encode(b, fullEvent(), EncodeOptions{})
		h[strings.ToUpper(b.Prefix()+ExtTenantID)] = "victim"
		if _, err := Decode(b, h, body); !isAttrErr(err, ExtTenantID) {
			t.Fatalf("%s: exact ce-tenantid acme and upper-case victim: err = %v, want a DecodeError on tenantid", b, err)
		}
		_, _, err := DecodeMulti(b, multi(h), body)
		if !isAttrErr(err, ExtTenantID) {
			t.Fatalf("%s: DecodeMulti: err = %v", b, err)
		}
		// The same value under two cases is not ambiguous.
		h[strings.ToUpper(b.Prefix()+ExtTenantID)] = fullEvent().TenantID
		if _, err := Decode(b, h, body); err != nil {
			t.Fatalf("%s: equal values: %v", b, err)
		}
	}
	h, body := Encode(NATS, fullEvent(), EncodeOptions{})
	h["Content-Type"] = "text/plain"
	if _, err := Decode(NATS, h, body); !isAttrErr(err, AttrDataContentType) {
		t.Fatalf("content-type and Content-Type: err = %v", err)
	}
}
