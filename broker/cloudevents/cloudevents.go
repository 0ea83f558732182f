package cloudevents

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/sanitize"
)

// Binding names a CloudEvents protocol binding. Each binding has its own
// header prefix; the attribute names after the prefix are the same.
type Binding int

// The supported protocol bindings.
const (
	NATS  Binding = iota + 1 // prefix "ce-", content type in "content-type"
	Kafka                    // prefix "ce_", content type in "content-type"
	AMQP                     // prefix "cloudEvents:", content type in the AMQP content-type property
)

// String names the binding.
func (b Binding) String() string {
	switch b {
	case NATS:
		return "nats"
	case Kafka:
		return "kafka"
	case AMQP:
		return "amqp"
	}
	return "binding(" + strconv.Itoa(int(b)) + ")"
}

// Valid reports whether b is one of the defined bindings.
func (b Binding) Valid() bool { return b >= NATS && b <= AMQP }

// Prefix is the header-name prefix of CloudEvents attributes in b:
// "ce-" (NATS), "ce_" (Kafka), "cloudEvents:" (AMQP), "" for an invalid binding.
func (b Binding) Prefix() string {
	switch b {
	case NATS:
		return "ce-"
	case Kafka:
		return "ce_"
	case AMQP:
		return "cloudEvents:"
	}
	return ""
}

// Header returns the header name of the CloudEvents attribute attr (for
// example "id", "sequence") in b. The datacontenttype attribute is
// [ContentTypeHeader] in every binding instead.
func (b Binding) Header(attr string) string {
	if attr == AttrDataContentType {
		return ContentTypeHeader
	}
	return b.Prefix() + attr
}

// ContentTypeHeader is the map key carrying datacontenttype in every
// binding: the NATS and Kafka bindings define exactly this lower-case
// header; for AMQP it stands for the message's content-type property, which
// the AMQP adapter moves out of the map into the property (and back when
// receiving).
const ContentTypeHeader = "content-type"

// TraceparentHeader is the W3C Trace Context header. Encode writes the
// event's trace context under it as well as in the CloudEvents traceparent
// extension: the extension is what the CloudEvents SDKs read, the plain
// header what OpenTelemetry's messaging instrumentations read. Decode reads
// the extension only.
const TraceparentHeader = "traceparent"

// SpecVersion is the only CloudEvents version produced and accepted.
const SpecVersion = "1.0"

// DefaultSource is the CloudEvents source when EncodeOptions.Source is empty.
const DefaultSource = "ferry"

// CloudEvents context attributes and the Ferry extension attributes, as
// they appear after the binding's prefix. Extension names are lower-case
// alphanumeric, as the specification requires.
const (
	AttrSpecVersion     = "specversion"
	AttrID              = "id"
	AttrSource          = "source"
	AttrType            = "type"
	AttrSubject         = "subject"
	AttrTime            = "time"
	AttrDataSchema      = "dataschema"
	AttrDataContentType = "datacontenttype"

	ExtSequence      = "sequence"      // aggregate_seq, decimal
	ExtPartitionKey  = "partitionkey"  // ferry.AggregateKey(tenant, aggregate type, aggregate id)
	ExtTraceparent   = "traceparent"   // W3C trace context
	ExtCorrelationID = "correlationid" // headers.correlation_id
	ExtCausationID   = "causationid"   // headers.causation_id
	ExtTenantID      = "tenantid"      // tenant_id
	ExtSchemaVersion = "schemaversion" // schema_version, decimal
	ExtAggregateType = "aggregatetype" // aggregate_type
	ExtPrincipal     = "principal"     // headers.principal
	ExtAction        = "action"        // headers.action
	ExtTarget        = "target"        // headers.target
)

// headerKeys are the header names Encode writes in one binding.
type headerKeys struct {
	specVersion, id, source, typ, subject, time                        string
	sequence, partitionKey, tenantID, aggregateType, schemaVersion     string
	traceparent, correlationID, causationID, principal, action, target string
}

// encodeKeys holds them per binding, computed once (read-only after
// init): Encode runs for every published event, and joining prefix and
// name for each of its headers was most of its allocations.
var encodeKeys = func() (out [AMQP + 1]headerKeys) {
	for b := NATS; b <= AMQP; b++ {
		p := b.Prefix()
		out[b] = headerKeys{
			specVersion: p + AttrSpecVersion, id: p + AttrID, source: p + AttrSource, typ: p + AttrType,
			subject: p + AttrSubject, time: p + AttrTime, sequence: p + ExtSequence, partitionKey: p + ExtPartitionKey,
			tenantID: p + ExtTenantID, aggregateType: p + ExtAggregateType, schemaVersion: p + ExtSchemaVersion,
			traceparent: p + ExtTraceparent, correlationID: p + ExtCorrelationID, causationID: p + ExtCausationID,
			principal: p + ExtPrincipal, action: p + ExtAction, target: p + ExtTarget,
		}
	}
	return out
}()

// EncodeOptions tunes Encode.
type EncodeOptions struct {
	// Source is the CloudEvents source attribute, a URI-reference naming
	// the producing service, e.g. "ferry://orders-service". Default "ferry".
	Source string
}

// Sentinel errors.
var (
	// ErrNotCloudEvent matches every Decode error: the message is not a
	// valid Ferry event in CloudEvents binary mode. The concrete error is a
	// *DecodeError naming the attribute.
	ErrNotCloudEvent = errors.New("cloudevents: not a valid Ferry CloudEvents message")
)

// DecodeError names the attribute (and header) that is missing or
// malformed. Its message quotes at most a short prefix of the offending
// value and never the body.
type DecodeError struct {
	Binding   Binding
	Attribute string // e.g. "id", "sequence", "datacontenttype"
	Header    string // the header name looked up, e.g. "ce-id"
	Reason    string
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("cloudevents: %s message: attribute %s (header %q): %s", e.Binding, e.Attribute, e.Header, e.Reason)
}

// Is reports ErrNotCloudEvent.
func (e *DecodeError) Is(target error) bool { return target == ErrNotCloudEvent }

// Encode maps ev onto binding b in CloudEvents 1.0 binary mode. headers
// holds the attribute headers, named exactly as the binding defines them
// (lower case), and "content-type" for datacontenttype; body is ev.Payload
// (not copied). Optional attributes and extensions are omitted when empty;
// dataschema is never set (Ferry has no schema URI to derive it from). An
// empty ev.ContentType is written as ferry.DefaultContentType, the value the
// outbox writer assigns. Broker-native ids (NATS Nats-Msg-Id, AMQP
// message-id, the Kafka key) are not in the map: the adapters set them.
//
// Encode panics if b is not a defined Binding (a programming error, like
// an invalid regexp literal); it never looks at b's validity otherwise.
func Encode(b Binding, ev ferry.Event, opts EncodeOptions) (headers map[string]string, body []byte) {
	h := make(map[string]string, 16)
	body = EncodeTo(b, &ev, opts, func(name, value string) { h[name] = value })
	return h, body
}

// EncodeTo is Encode writing each header through set, once per name, in a
// fixed order, instead of into a map: a publisher fills its client's own
// header type directly (it runs for every published event). It returns
// the body, ev.Payload.
func EncodeTo(b Binding, ev *ferry.Event, opts EncodeOptions, set func(name, value string)) (body []byte) {
	if !b.Valid() {
		panic(fmt.Sprintf("cloudevents: Encode with undefined binding %d", int(b)))
	}
	source := opts.Source
	if source == "" {
		source = DefaultSource
	}
	ct := ev.ContentType
	if ct == "" {
		ct = ferry.DefaultContentType
	}
	k := &encodeKeys[b]
	set(k.specVersion, SpecVersion)
	set(k.id, ev.ID.String())
	set(k.source, source)
	set(k.typ, ev.EventType)
	set(k.subject, ev.AggregateID)
	set(k.time, ev.OccurredAt.UTC().Format(time.RFC3339Nano))
	set(ContentTypeHeader, ct)
	set(k.sequence, strconv.FormatInt(ev.AggregateSeq, 10))
	set(k.partitionKey, ferry.AggregateKey(ev.TenantID, ev.AggregateType, ev.AggregateID))
	set(k.tenantID, ev.TenantID)
	set(k.aggregateType, ev.AggregateType)
	set(k.schemaVersion, strconv.Itoa(ev.SchemaVersion))
	opt := func(name, v string) {
		if v != "" {
			set(name, v)
		}
	}
	opt(k.traceparent, ev.Headers.Traceparent)
	// Also under the W3C name, unprefixed, which the standard
	// OpenTelemetry instrumentations of every broker client read.
	opt(TraceparentHeader, ev.Headers.Traceparent)
	opt(k.correlationID, ev.Headers.CorrelationID)
	opt(k.causationID, ev.Headers.CausationID)
	opt(k.principal, ev.Headers.Principal)
	opt(k.action, ev.Headers.Action)
	opt(k.target, ev.Headers.Target)
	return ev.Payload
}

// Decode reconstructs a ferry.Event from a binary-mode message of binding b.
// Every field is filled except Topic (the caller knows the destination) and
// Shard (a producer-side detail). Header names are matched exactly first and
// then case-insensitively, so a broker or proxy that changes case does not
// lose attributes; two headers for one attribute (differently cased, or
// AMQP's two prefixes) with different values are rejected as ambiguous,
// also when one of them matches exactly. A header map cannot repeat a name;
// for bindings whose headers can (NATS, Kafka) see [DecodeMulti]. For AMQP the prefix
// "cloudEvents_" (the binding's JMS-compatible form) is accepted too.
//
// Required: specversion "1.0", id (a UUID), source, type, subject, time
// (RFC 3339), datacontenttype, and the extensions sequence (>= 1),
// tenantid, aggregatetype and schemaversion (>= 1). partitionkey, when
// present, must equal ferry.AggregateKey of the decoded aggregate. Every
// string attribute must be valid UTF-8 without control characters. The
// returned Payload aliases body. Decode never panics; every error is a
// *DecodeError matching ErrNotCloudEvent.
func Decode(b Binding, headers map[string]string, body []byte) (ferry.Event, error) {
	ev, err := decode(b, headers, body)
	if err != nil {
		return ferry.Event{}, err
	}
	return ev, nil
}

func decode(b Binding, headers map[string]string, body []byte) (ferry.Event, error) {
	var ev ferry.Event
	if !b.Valid() {
		return ev, &DecodeError{Binding: b, Attribute: AttrSpecVersion, Reason: "undefined binding"}
	}
	d := decoder{b: b, h: headers}
	if err := d.ambiguous(); err != nil {
		return ev, err
	}

	sv, err := d.get(AttrSpecVersion, true)
	if err != nil {
		return ev, err
	}
	if sv != SpecVersion {
		return ev, d.bad(AttrSpecVersion, "unsupported spec version %q, want %q", short(sv), SpecVersion)
	}

	idStr, err := d.get(AttrID, true)
	if err != nil {
		return ev, err
	}
	if len(idStr) != 36 {
		return ev, d.bad(AttrID, "%q is not a UUID in canonical 8-4-4-4-12 form", short(idStr))
	}
	id, perr := uuid.Parse(idStr)
	if perr != nil {
		return ev, d.bad(AttrID, "%q is not a UUID: %v", short(idStr), perr)
	}
	if id == uuid.Nil {
		return ev, d.bad(AttrID, "must not be the nil UUID")
	}
	ev.ID = id

	if _, err := d.get(AttrSource, true); err != nil {
		return ev, err
	}
	if ev.EventType, err = d.get(AttrType, true); err != nil {
		return ev, err
	}
	if ev.AggregateID, err = d.get(AttrSubject, true); err != nil {
		return ev, err
	}

	ts, err := d.get(AttrTime, true)
	if err != nil {
		return ev, err
	}
	t, perr := time.Parse(time.RFC3339Nano, ts)
	if perr != nil {
		return ev, d.bad(AttrTime, "%q is not an RFC 3339 timestamp", short(ts))
	}
	ev.OccurredAt = t.UTC()
	if y := ev.OccurredAt.Year(); y < 1 || y > 9999 {
		// Outside 0001..9999 UTC the timestamp cannot be written back as
		// RFC 3339, so the event would not round-trip.
		return ev, d.bad(AttrTime, "%q is outside years 0001..9999 UTC", short(ts))
	}

	if ev.ContentType, err = d.get(AttrDataContentType, true); err != nil {
		return ev, err
	}

	seq, err := d.get(ExtSequence, true)
	if err != nil {
		return ev, err
	}
	n, ok := parseDecimal(seq)
	if !ok || n < 1 {
		return ev, d.bad(ExtSequence, "%q is not a decimal integer >= 1 without sign or leading zeros", short(seq))
	}
	ev.AggregateSeq = n

	if ev.TenantID, err = d.get(ExtTenantID, true); err != nil {
		return ev, err
	}
	if ev.AggregateType, err = d.get(ExtAggregateType, true); err != nil {
		return ev, err
	}

	sch, err := d.get(ExtSchemaVersion, true)
	if err != nil {
		return ev, err
	}
	n, ok = parseDecimal(sch)
	if !ok || n < 1 || n > int64(maxInt) {
		return ev, d.bad(ExtSchemaVersion, "%q is not a decimal integer >= 1 without sign or leading zeros", short(sch))
	}
	ev.SchemaVersion = int(n)

	pk, err := d.get(ExtPartitionKey, false)
	if err != nil {
		return ev, err
	}
	if pk != "" {
		if want := ferry.AggregateKey(ev.TenantID, ev.AggregateType, ev.AggregateID); pk != want {
			return ev, d.bad(ExtPartitionKey, "%q does not match tenantid/aggregatetype/subject %q", short(pk), short(want))
		}
	}

	for _, f := range []struct {
		attr string
		dst  *string
	}{
		{ExtTraceparent, &ev.Headers.Traceparent},
		{ExtCorrelationID, &ev.Headers.CorrelationID},
		{ExtCausationID, &ev.Headers.CausationID},
		{ExtPrincipal, &ev.Headers.Principal},
		{ExtAction, &ev.Headers.Action},
		{ExtTarget, &ev.Headers.Target},
	} {
		if *f.dst, err = d.get(f.attr, false); err != nil {
			return ev, err
		}
	}
	if _, err := d.get(AttrDataSchema, false); err != nil {
		return ev, err
	}
	ev.Payload = body
	return ev, nil
}

// DecodeMulti is [Decode] for bindings whose headers may repeat a name:
// NATS message headers and Kafka record headers are lists, not maps. A
// CloudEvents attribute given more than once — any header carrying the
// binding's attribute prefix (case-insensitively), or content-type, with
// two or more values, equal or not — is ambiguous, and DecodeMulti fails
// with a *DecodeError naming the attribute and the header instead of
// picking one value. A repeated header that carries no attribute (an
// application's own) is not Ferry's to judge and does not fail decoding.
//
// flat is the single-valued view of headers for broker.RawMessage: one
// value as is, repeated values joined with ", " in the order received (the
// HTTP convention for combining repeated fields), so the raw record of a
// parked message keeps every value. flat is returned with the error too.
// The AMQP headers table cannot repeat a name; its adapter calls Decode.
func DecodeMulti(b Binding, headers map[string][]string, body []byte) (ev ferry.Event, flat map[string]string, err error) {
	flat = make(map[string]string, len(headers))
	var repeated []string
	for k, vs := range headers {
		switch len(vs) {
		case 0:
			continue
		case 1:
			flat[k] = vs[0]
		default:
			flat[k] = strings.Join(vs, ", ")
			if b.attributeOf(k) != "" {
				repeated = append(repeated, k)
			}
		}
	}
	if len(repeated) > 0 {
		slices.Sort(repeated) // the same message always names the same attribute
		k := repeated[0]
		vs := headers[k]
		quoted := make([]string, 0, 3)
		for i, v := range vs {
			if i == 2 {
				quoted = append(quoted, "…")
				break
			}
			quoted = append(quoted, strconv.Quote(short(v)))
		}
		return ferry.Event{}, flat, &DecodeError{Binding: b, Attribute: b.attributeOf(k), Header: k,
			Reason: fmt.Sprintf("given %d values (%s): a repeated attribute is ambiguous", len(vs), strings.Join(quoted, ", "))}
	}
	ev, err = Decode(b, flat, body)
	return ev, flat, err
}

// attributeOf returns the CloudEvents attribute a header name carries in b
// (matched case-insensitively, as Decode's fallback does), or "".
func (b Binding) attributeOf(header string) string {
	if strings.EqualFold(header, ContentTypeHeader) {
		return AttrDataContentType
	}
	prefixes := []string{b.Prefix()}
	if b == AMQP {
		prefixes = append(prefixes, "cloudEvents_")
	}
	for _, p := range prefixes {
		if p != "" && len(header) > len(p) && strings.EqualFold(header[:len(p)], p) {
			return strings.ToLower(header[len(p):])
		}
	}
	return ""
}

const maxInt = int(^uint(0) >> 1)

type decoder struct {
	b Binding
	h map[string]string
}

func (d decoder) names(attr string) []string {
	if attr == AttrDataContentType {
		return []string{ContentTypeHeader}
	}
	if d.b == AMQP {
		return []string{"cloudEvents:" + attr, "cloudEvents_" + attr}
	}
	return []string{d.b.Prefix() + attr}
}

// ambiguous rejects an attribute present under two header names — names
// differing only in case (NATS and Kafka header names are case-sensitive,
// so both reach the decoder), or AMQP's two prefixes — with different
// values: an exact-case match must not silently win over the other. Of
// several such attributes the first in name order is named.
func (d decoder) ambiguous() error {
	var seen map[string]string
	bad := ""
	for k, v := range d.h {
		attr := d.b.attributeOf(k)
		if attr == "" {
			continue
		}
		if seen == nil {
			seen = make(map[string]string, len(d.h))
		}
		if prev, ok := seen[attr]; ok && prev != v && (bad == "" || attr < bad) {
			bad = attr
		}
		seen[attr] = v
	}
	if bad != "" {
		return d.bad(bad, "present under two header names (differing in case or prefix) with different values")
	}
	return nil
}

func (d decoder) bad(attr, format string, args ...any) *DecodeError {
	return &DecodeError{Binding: d.b, Attribute: attr, Header: d.b.Header(attr), Reason: fmt.Sprintf(format, args...)}
}

// get looks attr up: exact names first, then case-insensitively. It
// rejects an empty required value, invalid UTF-8 and control characters.
func (d decoder) get(attr string, required bool) (string, error) {
	names := d.names(attr)
	var (
		v     string
		found bool
	)
	for _, n := range names {
		if x, ok := d.h[n]; ok {
			if found && x != v {
				return "", d.bad(attr, "present under two header names with different values")
			}
			v, found = x, true
		}
	}
	if !found {
		for k, x := range d.h {
			for _, n := range names {
				if len(k) == len(n) && strings.EqualFold(k, n) {
					if found && x != v {
						return "", d.bad(attr, "present under two header names differing in case with different values")
					}
					v, found = x, true
				}
			}
		}
	}
	if v == "" {
		if required {
			if attr == AttrSpecVersion {
				return "", d.bad(attr, "missing: not a CloudEvents binary-mode message (structured mode is not supported)")
			}
			return "", d.bad(attr, "missing or empty")
		}
		return "", nil
	}
	if !utf8.ValidString(v) {
		return "", d.bad(attr, "not valid UTF-8")
	}
	for _, r := range v {
		if r < 0x20 || r == 0x7f {
			return "", d.bad(attr, "contains a control character")
		}
	}
	return v, nil
}

// parseDecimal accepts only the canonical decimal form Encode writes: no
// sign, no leading zeros, no spaces; anything else would not round-trip.
func parseDecimal(s string) (int64, bool) {
	if s == "" || len(s) > 19 || (len(s) > 1 && s[0] == '0') {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, false
	}
	return n, true
}

// short quotes at most 64 bytes of a header value in errors.
func short(s string) string { return sanitize.Cut(s, 64) }
