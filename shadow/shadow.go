// Package shadow runs Ferry beside an existing publisher during adoption:
// [Publisher] sends every event to a shadow destination (topic prefixed,
// e.g. "shadow.order.events") so consumers do not see a second copy, and
// [Compare] reads what the old code published and what the outbox
// published and reports the difference: events the old path lost (missing
// from production), events only the old path sent (extra: e.g. published for
// a rolled-back transaction), events in a different order, and events whose
// bodies differ — matched by event id or by a business key.
package shadow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
)

// Publisher prefixes every event's topic before handing it to the
// underlying publisher (NATS subject, Kafka topic, RabbitMQ routing key).
type Publisher struct {
	inner  broker.Publisher
	prefix string
}

var _ broker.Publisher = (*Publisher)(nil)

// NewPublisher wraps inner; prefix must be non-empty (e.g. "shadow.").
func NewPublisher(inner broker.Publisher, prefix string) (*Publisher, error) {
	if prefix == "" {
		return nil, errors.New("shadow: prefix must not be empty (e.g. \"shadow.\")")
	}
	return &Publisher{inner: inner, prefix: prefix}, nil
}

// Topics returns topics with the prefix, for destination checks.
func Topics(prefix string, topics []string) []string {
	out := make([]string, len(topics))
	for i, t := range topics {
		out[i] = prefix + t
	}
	return out
}

// Name is the underlying broker's name.
func (p *Publisher) Name() string { return p.inner.Name() }

// Publish sends copies of events with prefixed topics.
func (p *Publisher) Publish(ctx context.Context, events []ferry.Event) []broker.Result {
	cp := make([]ferry.Event, len(events))
	for i, e := range events {
		e.Topic = p.prefix + e.Topic
		cp[i] = e
	}
	return p.inner.Publish(ctx, cp)
}

// Ping checks the underlying broker.
func (p *Publisher) Ping(ctx context.Context) error { return p.inner.Ping(ctx) }

// Close closes the underlying publisher.
func (p *Publisher) Close() error { return p.inner.Close() }

// Reader reads one side of a comparison: every message of one stream
// (NATS stream, Kafka topic, RabbitMQ queue) from since up to what was
// stored when the read began, in stream order. [NATSReader], [KafkaReader]
// and [RabbitReader] implement it; [Compare] is the one comparison core.
type Reader interface {
	Read(ctx context.Context, since time.Time) ([]Message, error)
}

// Message is one message read from a stream.
type Message struct {
	Seq uint64 // position in its stream
	// Scope is the ordering scope: messages of different scopes have no
	// order between them (Kafka: the record key, or the partition of a
	// record without one). Empty for a stream with one total order (NATS,
	// RabbitMQ).
	Scope   string
	Headers map[string]string // first value of each header
	Body    []byte
}

// Key says how messages of the two streams are matched: "id" (the CloudEvents
// id attribute, i.e. Ferry's event id: ce-id / Nats-Msg-Id), "ce:<attr>" (any
// CloudEvents attribute or header, e.g. ce:subject), or "json:<pointer>" (a
// JSON pointer into the body, e.g. json:/order_id — for an old publisher that
// sends bare payloads).
type Key struct {
	kind string // id, header, json
	arg  string
}

// ParseKey parses a --key value.
func ParseKey(s string) (Key, error) {
	switch {
	case s == "" || s == "id":
		return Key{kind: "id"}, nil
	case strings.HasPrefix(s, "ce:") && len(s) > 3:
		return Key{kind: "header", arg: s[3:]}, nil
	case strings.HasPrefix(s, "json:/"):
		return Key{kind: "json", arg: s[5:]}, nil
	}
	return Key{}, fmt.Errorf("shadow: key %q: want id, ce:<attribute> or json:/<pointer>", s)
}

func (k Key) String() string {
	switch k.kind {
	case "header":
		return "ce:" + k.arg
	case "json":
		return "json:" + k.arg
	}
	return "id"
}

// Of extracts the key of m, or an error naming what is missing.
func (k Key) Of(m Message) (string, error) {
	switch k.kind {
	case "id":
		for _, h := range []string{"ce-id", "Ce-Id", "ce_id", "cloudEvents:id", "cloudEvents_id", "Nats-Msg-Id"} {
			if v := m.Headers[h]; v != "" {
				return v, nil
			}
		}
		return "", fmt.Errorf("message %d has no ce-id, ce_id, cloudEvents:id or Nats-Msg-Id header (match by --key json:/<pointer> instead)", m.Seq)
	case "header":
		for _, h := range []string{k.arg, "ce-" + k.arg, "Ce-" + k.arg, "ce_" + k.arg, "cloudEvents:" + k.arg, "cloudEvents_" + k.arg} {
			if v := m.Headers[h]; v != "" {
				return v, nil
			}
		}
		return "", fmt.Errorf("message %d has no %s attribute", m.Seq, k.arg)
	}
	var doc any
	if err := json.Unmarshal(m.Body, &doc); err != nil {
		return "", fmt.Errorf("message %d: body is not JSON, cannot read %s", m.Seq, k.arg)
	}
	v, ok := pointer(doc, k.arg)
	if !ok {
		return "", fmt.Errorf("message %d: body has no %s", m.Seq, k.arg)
	}
	if s, ok := v.(string); ok {
		return s, nil
	}
	b, _ := json.Marshal(v)
	return string(b), nil
}

func pointer(doc any, p string) (any, bool) {
	if p == "" || p == "/" {
		return doc, true
	}
	for _, part := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		part = strings.NewReplacer("~1", "/", "~0", "~").Replace(part)
		switch d := doc.(type) {
		case map[string]any:
			v, ok := d[part]
			if !ok {
				return nil, false
			}
			doc = v
		case []any:
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(d) {
				return nil, false
			}
			doc = d[i]
		default:
			return nil, false
		}
	}
	return doc, true
}

// Report is the outcome of Compare. Keys are listed in stream order.
type Report struct {
	Key        string
	Production int      // messages read
	Shadow     int      // messages read
	Missing    []string // in shadow, not in production: the old path lost them
	Extra      []string // in production, not in shadow: only the old path sent them
	Reordered  []string // in both, but out of the shadow's relative order
	Differing  []string // in both, different bodies
	Duplicates int      // repeated keys (counted once each; at-least-once redelivery)
	KeyErrors  []string // messages whose key could not be read
}

// Clean reports whether the streams agree.
func (r *Report) Clean() bool {
	return len(r.Missing)+len(r.Extra)+len(r.Reordered)+len(r.Differing)+len(r.KeyErrors) == 0
}

// Compare matches prod and shadow messages by key. Bodies are compared as
// JSON (key order and spacing ignored) when both parse, else byte for byte.
// Reordered counts the fewest common keys that must move to make the
// production order match the shadow's (keys not on a longest common
// ordered subsequence), within each ordering scope of the shadow side
// ([Message.Scope]: Ferry's order guarantee is per aggregate, so two
// events the shadow holds under different Kafka keys are never counted as
// reordered).
func Compare(prod, shadow []Message, key Key) *Report {
	r := &Report{Key: key.String(), Production: len(prod), Shadow: len(shadow)}
	index := func(ms []Message, which string) ([]string, map[string]Message) {
		var order []string
		by := map[string]Message{}
		for _, m := range ms {
			k, err := key.Of(m)
			if err != nil {
				r.KeyErrors = append(r.KeyErrors, which+": "+err.Error())
				continue
			}
			if _, dup := by[k]; dup {
				r.Duplicates++
				continue
			}
			by[k] = m
			order = append(order, k)
		}
		return order, by
	}
	pOrder, pBy := index(prod, "production")
	sOrder, sBy := index(shadow, "shadow")
	sPos := map[string]int{}
	for i, k := range sOrder {
		sPos[k] = i
		if _, ok := pBy[k]; !ok {
			r.Missing = append(r.Missing, k)
		}
	}
	var common []string
	scopes := map[string][]string{} // shadow scope -> common keys in production order
	var scopeOrder []string
	for _, k := range pOrder {
		sm, ok := sBy[k]
		if !ok {
			r.Extra = append(r.Extra, k)
			continue
		}
		common = append(common, k)
		if _, seen := scopes[sm.Scope]; !seen {
			scopeOrder = append(scopeOrder, sm.Scope)
		}
		scopes[sm.Scope] = append(scopes[sm.Scope], k)
		if !sameBody(pBy[k].Body, sm.Body) {
			r.Differing = append(r.Differing, k)
		}
	}
	moved := map[string]bool{}
	for _, sc := range scopeOrder {
		for _, k := range outOfOrder(scopes[sc], sPos) {
			moved[k] = true
		}
	}
	for _, k := range common {
		if moved[k] {
			r.Reordered = append(r.Reordered, k)
		}
	}
	return r
}

func sameBody(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) == nil && json.Unmarshal(b, &y) == nil {
		ca, _ := json.Marshal(x)
		cb, _ := json.Marshal(y)
		return bytes.Equal(ca, cb)
	}
	return bytes.Equal(a, b)
}

// outOfOrder returns the keys of common (production order) that are not on
// a longest increasing subsequence of their shadow positions.
func outOfOrder(common []string, sPos map[string]int) []string {
	n := len(common)
	if n == 0 {
		return nil
	}
	// patience sorting with predecessor links, O(n log n)
	tails := []int{} // indexes into common
	prev := make([]int, n)
	for i, k := range common {
		p := sPos[k]
		j := sort.Search(len(tails), func(j int) bool { return sPos[common[tails[j]]] >= p })
		if j > 0 {
			prev[i] = tails[j-1]
		} else {
			prev[i] = -1
		}
		if j == len(tails) {
			tails = append(tails, i)
		} else {
			tails[j] = i
		}
	}
	on := make([]bool, n)
	for i := tails[len(tails)-1]; i >= 0; i = prev[i] {
		on[i] = true
	}
	var out []string
	for i, k := range common {
		if !on[i] {
			out = append(out, k)
		}
	}
	return out
}
