package ops

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// MaskMarker replaces every masked value in a revealed JSON payload.
const MaskMarker = "***"

// MaskAll is the policy key whose paths apply to every payload, in addition
// to the paths of its own type.
const MaskAll = "*"

// ErrInvalidMask: a field mask file or policy is malformed; see *MaskError.
var ErrInvalidMask = errors.New("ops: invalid field mask")

// MaskError names the event type and path that were rejected and why.
type MaskError struct {
	EventType string
	Path      string
	Reason    string
}

func (e *MaskError) Error() string {
	if e.EventType == "" {
		return fmt.Sprintf("ops: invalid field mask: %s", e.Reason)
	}
	if e.Path == "" {
		return fmt.Sprintf("ops: invalid field mask for %q: %s", e.EventType, e.Reason)
	}
	return fmt.Sprintf("ops: invalid field mask for %q: path %q: %s", e.EventType, e.Path, e.Reason)
}

// Is reports ErrInvalidMask.
func (e *MaskError) Is(target error) bool { return target == ErrInvalidMask }

// MaskPolicy says which fields of which payloads a revealed payload shows
// as MaskMarker. It maps an event type to JSON paths; the key "*" (MaskAll)
// applies to every payload. The payloads it covers and their keys:
//
//   - an outbox event (RevealPayload) and a parked message
//     (RevealParkedPayload): its event type, e.g. "order.created";
//   - an effect intent's request body (RevealEffectRequest), which has no
//     event type: "effect:" + target + "/" + operation, e.g.
//     "effect:psp/charge".
//
// A path starts at the payload's root "$" and walks it:
//
//	$.customer.email      member "email" of member "customer"
//	customer.email        the same ("$." may be left out)
//	$.items[*].card       member "card" of every element of array "items"
//	$.items[0].card       ... of the first element only
//	$.meta.*              every member of object "meta"
//	$["odd.key"].x        a member whose name holds "." or brackets
//	$                     the whole payload
//
// Names match exactly (case-sensitive). A masked value of any JSON type
// (string, number, object, array) becomes the string MaskMarker; the
// member or element stays, so the payload keeps its shape. A path that
// matches nothing masks nothing.
//
// Fail closed: when paths apply to a payload that is not JSON (encrypted,
// binary, text, truncated), the whole payload is withheld rather than
// shown unmasked. A payload with no applicable paths is shown as stored.
//
// Masks apply to every role: opsauth has viewer (never sees payloads) and
// operator (may reveal, masked); no role sees past the mask. The zero
// value and nil mask nothing.
type MaskPolicy struct {
	paths map[string][]maskPath // event type → compiled paths
}

type maskPath struct {
	src  string
	segs []maskSeg
}

// maskSeg is one step: a member name, every member (wild on an object),
// one index, or every element (wild on an array).
type maskSeg struct {
	name  string
	index int
	array bool // index or [*]
	wild  bool
}

// NewMaskPolicy compiles a policy: event type (or "*") → JSON paths. The
// error (a *MaskError, ErrInvalidMask) names the event type and path.
func NewMaskPolicy(fields map[string][]string) (*MaskPolicy, error) {
	p := &MaskPolicy{paths: map[string][]maskPath{}}
	types := make([]string, 0, len(fields))
	for t := range fields {
		types = append(types, t)
	}
	sort.Strings(types)
	for _, t := range types {
		if strings.TrimSpace(t) == "" {
			return nil, &MaskError{Reason: "an empty event type (use \"*\" for every type)"}
		}
		if len(fields[t]) == 0 {
			return nil, &MaskError{EventType: t, Reason: "no paths listed"}
		}
		for _, src := range fields[t] {
			segs, err := parseMaskPath(src)
			if err != nil {
				return nil, &MaskError{EventType: t, Path: src, Reason: err.Error()}
			}
			p.paths[t] = append(p.paths[t], maskPath{src: src, segs: segs})
		}
	}
	return p, nil
}

// ParseMaskPolicy reads a policy from YAML (or JSON, which is YAML): a map
// from event type to a list of paths.
//
//	order.created: ["$.customer.email", "$.card.number"]
//	"*": ["$.ssn"]
func ParseMaskPolicy(data []byte) (*MaskPolicy, error) {
	var fields map[string][]string
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&fields); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &MaskError{Reason: "empty file: expected a map of event type to a list of JSON paths"}
		}
		return nil, &MaskError{Reason: fmt.Sprintf("expected a map of event type to a list of JSON paths: %v", err)}
	}
	if len(fields) == 0 {
		return nil, &MaskError{Reason: "no event types listed"}
	}
	return NewMaskPolicy(fields)
}

// LoadMaskPolicy reads a policy file (see ParseMaskPolicy).
func LoadMaskPolicy(path string) (*MaskPolicy, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("ops: read field mask: %w", err)
	}
	p, err := ParseMaskPolicy(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return p, nil
}

// WithMask sets the field mask every revealed payload goes through (see
// MaskPolicy). Nil masks nothing.
func WithMask(p *MaskPolicy) Option { return func(c *config) { c.mask = p } }

func parseMaskPath(src string) ([]maskSeg, error) {
	s := strings.TrimSpace(src)
	if s == "" {
		return nil, errors.New("empty path")
	}
	switch {
	case s == "$":
		return nil, nil
	case strings.HasPrefix(s, "$"):
		s = s[1:]
		if s[0] != '.' && s[0] != '[' {
			return nil, errors.New(`after "$" expected "." or "["`)
		}
	default:
		s = "." + s
	}
	var segs []maskSeg
	for s != "" {
		switch s[0] {
		case '.':
			s = s[1:]
			end := strings.IndexAny(s, ".[]")
			if end < 0 {
				end = len(s)
			}
			name := s[:end]
			s = s[end:]
			switch name {
			case "":
				return nil, errors.New(`empty member name (".." or a trailing ".")`)
			case "*":
				segs = append(segs, maskSeg{wild: true})
			default:
				segs = append(segs, maskSeg{name: name})
			}
		case '[':
			end := strings.IndexByte(s, ']')
			if len(s) > 1 && s[1] == '"' {
				// ["name"]: the closing quote is followed by ']'.
				q := strings.Index(s[2:], `"]`)
				if q < 0 {
					return nil, errors.New(`unterminated ["name"]`)
				}
				name := s[2 : 2+q]
				if name == "" {
					return nil, errors.New(`empty member name [""]`)
				}
				segs = append(segs, maskSeg{name: name})
				s = s[2+q+2:]
				continue
			}
			if end < 0 {
				return nil, errors.New(`unterminated "["`)
			}
			in := s[1:end]
			s = s[end+1:]
			if in == "*" {
				segs = append(segs, maskSeg{array: true, wild: true})
				continue
			}
			n, err := strconv.Atoi(in)
			if err != nil || n < 0 {
				return nil, fmt.Errorf(`[%s]: expected [*], [N] (N >= 0) or ["name"]`, in)
			}
			segs = append(segs, maskSeg{array: true, index: n})
		default:
			return nil, fmt.Errorf(`unexpected %q: expected "." or "["`, s[:1])
		}
	}
	return segs, nil
}

// MaskResult is what a policy did to one payload.
type MaskResult struct {
	// Payload is what may be shown: the masked JSON, the payload as stored
	// when no paths apply, or nil when Withheld.
	Payload []byte
	// Masked lists the policy paths that matched at least one value, in
	// policy order; MaskedValues counts the values replaced.
	Masked       []string
	MaskedValues int
	// Withheld: paths apply but the payload is not JSON, so nothing of it
	// is shown (fail closed); WithheldReason says why.
	Withheld       bool
	WithheldReason string
}

// Apply masks payload, a payload of eventType (see MaskPolicy for the
// keys) with contentType ("" when unknown, as for an effect request). A
// nil policy returns the payload unchanged. When paths apply, a content
// type other than application/json or a +json type (protobuf, avro, an
// encrypted envelope) withholds the payload, as does a body that is not
// JSON whatever its type says.
func (p *MaskPolicy) Apply(eventType, contentType string, payload []byte) MaskResult {
	paths := p.pathsFor(eventType)
	if len(paths) == 0 {
		return MaskResult{Payload: payload}
	}
	withheld := func(reason string) MaskResult {
		return MaskResult{Withheld: true, WithheldReason: reason}
	}
	if !jsonContentType(contentType) {
		return withheld(fmt.Sprintf("the field mask names fields for %q but the content type %q is not JSON: withheld, not shown unmasked", eventType, contentType))
	}
	if !json.Valid(payload) {
		return withheld(fmt.Sprintf("the field mask names fields for %q but the payload is not JSON (encrypted, binary or text): withheld, not shown unmasked", eventType))
	}
	dec := json.NewDecoder(bytes.NewReader(payload))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return withheld("the payload could not be decoded as JSON: withheld")
	}
	res := MaskResult{}
	for _, mp := range paths {
		var n int
		doc, n = maskAt(doc, mp.segs)
		if n > 0 {
			res.Masked = append(res.Masked, mp.src)
			res.MaskedValues += n
		}
	}
	// Always re-encode: what is shown is exactly the decoded document, so
	// a duplicate member the decoder dropped cannot slip through.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return withheld("the masked payload could not be encoded: withheld")
	}
	res.Payload = bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	return res
}

// jsonContentType: empty (unknown), application/json or any +json type,
// parameters ignored.
func jsonContentType(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	mt = strings.ToLower(strings.TrimSpace(mt))
	return mt == "" || mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

func (p *MaskPolicy) pathsFor(eventType string) []maskPath {
	if p == nil {
		return nil
	}
	own := p.paths[eventType]
	if eventType == MaskAll {
		own = nil
	}
	all := p.paths[MaskAll]
	if len(own) == 0 {
		return all
	}
	return append(append([]maskPath(nil), own...), all...)
}

// maskAt replaces the values segs reach in v and returns v and the count.
func maskAt(v any, segs []maskSeg) (any, int) {
	if len(segs) == 0 {
		if s, ok := v.(string); ok && s == MaskMarker {
			return v, 0 // already masked by an earlier path
		}
		return MaskMarker, 1
	}
	seg, rest := segs[0], segs[1:]
	n := 0
	switch x := v.(type) {
	case map[string]any:
		if seg.array {
			return v, 0
		}
		if seg.wild {
			for k, c := range x {
				var m int
				x[k], m = maskAt(c, rest)
				n += m
			}
			return x, n
		}
		if c, ok := x[seg.name]; ok {
			x[seg.name], n = maskAt(c, rest)
		}
		return x, n
	case []any:
		if !seg.array {
			return v, 0
		}
		if seg.wild {
			for i, c := range x {
				var m int
				x[i], m = maskAt(c, rest)
				n += m
			}
			return x, n
		}
		if seg.index < len(x) {
			x[seg.index], n = maskAt(x[seg.index], rest)
		}
		return x, n
	}
	return v, 0
}

// applyMask runs the Ops' policy over a revealed payload of eventType.
func (o *Ops) applyMask(eventType string, out *RevealedPayload) {
	if o.cfg.mask == nil {
		return
	}
	r := o.cfg.mask.Apply(eventType, out.ContentType, out.Payload)
	out.Payload, out.Masked, out.MaskedValues = r.Payload, r.Masked, r.MaskedValues
	out.Withheld, out.WithheldReason = r.Withheld, r.WithheldReason
}
