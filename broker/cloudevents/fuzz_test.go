package cloudevents

import (
	"errors"
	"maps"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
)

// The fuzzer's headers are one string: "key\x00value" pairs joined by "\x01".
func packHeaders(h map[string]string) string {
	var sb strings.Builder
	for k, v := range h {
		if sb.Len() > 0 {
			sb.WriteByte(1)
		}
		sb.WriteString(k)
		sb.WriteByte(0)
		sb.WriteString(v)
	}
	return sb.String()
}

func unpackHeaders(s string) map[string]string {
	h := map[string]string{}
	if s == "" {
		return h
	}
	for _, kv := range strings.Split(s, "\x01") {
		k, v, _ := strings.Cut(kv, "\x00")
		h[k] = v
	}
	return h
}

// FuzzDecode feeds arbitrary headers and bodies to Decode for every
// binding: it must never panic, and whatever it accepts must survive
// Encode→Decode unchanged (so a consumer that re-publishes an event, or
// compares fingerprints, sees the same event).
//
//	go test ./broker/cloudevents -run '^$' -fuzz FuzzDecode -fuzztime 60s
func FuzzDecode(f *testing.F) {
	for _, b := range bindings {
		for _, ev := range []func() (string, []byte){
			func() (string, []byte) {
				h, body := Encode(b, fullEvent(), EncodeOptions{})
				return packHeaders(h), body
			},
			func() (string, []byte) {
				h, body := Encode(b, minimalEvent(), EncodeOptions{})
				return packHeaders(h), body
			},
		} {
			h, body := ev()
			f.Add(uint8(b), h, body)
		}
	}
	f.Add(uint8(NATS), "", []byte(nil))
	f.Add(uint8(AMQP), "cloudEvents_specversion\x001.0", []byte("x"))

	f.Fuzz(func(t *testing.T, bb uint8, packed string, body []byte) {
		b := Binding(bb % 4) // includes the undefined 0
		headers := unpackHeaders(packed)
		ev, err := Decode(b, headers, body)
		if err != nil {
			if !reflect.DeepEqual(ev, ferry.Event{}) {
				t.Fatal("non-zero event returned with an error")
			}
			return
		}
		if !b.Valid() {
			t.Fatal("undefined binding accepted")
		}
		h2, body2 := Encode(b, ev, EncodeOptions{Source: headers[b.Prefix()+AttrSource]})
		ev2, err := Decode(b, h2, body2)
		if err != nil {
			t.Fatalf("re-encoded event does not decode: %v", err)
		}
		sameEvent(t, ev2, ev)
		if ev.OccurredAt.Location() != time.UTC {
			t.Fatal("OccurredAt not UTC")
		}
		// Encoding is a fixed point from here on.
		h3, _ := Encode(b, ev2, EncodeOptions{Source: headers[b.Prefix()+AttrSource]})
		if len(h3) != len(h2) {
			t.Fatal("encoding not stable")
		}
		for k, v := range h2 {
			if h3[k] != v {
				t.Fatalf("header %s: %q then %q", k, v, h3[k])
			}
		}
	})
}

// FuzzDecodeMulti feeds multi-valued headers (a key may repeat) to
// DecodeMulti: it must never panic; if a header carrying an attribute is
// repeated it must fail naming an attribute; otherwise it must agree with
// Decode on the single-valued headers.
//
//	go test ./broker/cloudevents -run '^$' -fuzz FuzzDecodeMulti -fuzztime 60s
func FuzzDecodeMulti(f *testing.F) {
	for _, b := range bindings {
		h, body := Encode(b, fullEvent(), EncodeOptions{})
		packed := packHeaders(h)
		f.Add(uint8(b), packed, body)
		f.Add(uint8(b), packed+"\x01"+b.Prefix()+ExtTenantID+"\x00victim", body)
		f.Add(uint8(b), packed+"\x01x-other\x00v", body)
	}
	f.Fuzz(func(t *testing.T, bb uint8, packed string, body []byte) {
		b := Binding(bb % 4)
		m := map[string][]string{}
		if packed != "" {
			for _, kv := range strings.Split(packed, "\x01") {
				k, v, _ := strings.Cut(kv, "\x00")
				m[k] = append(m[k], v)
			}
		}
		ev, flat, err := DecodeMulti(b, m, body)
		repeatedAttr := false
		single := map[string]string{}
		for k, vs := range m {
			if len(vs) > 1 && b.attributeOf(k) != "" {
				repeatedAttr = true
			}
			single[k] = strings.Join(vs, ", ")
		}
		if !maps.Equal(flat, single) {
			t.Fatalf("flat %v, want %v", flat, single)
		}
		if repeatedAttr {
			var de *DecodeError
			if !errors.As(err, &de) || de.Attribute == "" || !reflect.DeepEqual(ev, ferry.Event{}) {
				t.Fatalf("repeated attribute accepted: %v", err)
			}
			return
		}
		ev2, err2 := Decode(b, single, body)
		if (err == nil) != (err2 == nil) || !reflect.DeepEqual(ev, ev2) {
			t.Fatalf("DecodeMulti (%v) and Decode (%v) disagree", err, err2)
		}
	})
}
