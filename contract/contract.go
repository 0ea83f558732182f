// Package contract keeps event contracts: one JSON Schema per (event type,
// schema version), kept in the service's repository as
//
//	contracts/<event_type>/v<N>.json          the schema of version N (N >= 1)
//	contracts/<event_type>/v<N>.samples/*.json golden payloads that must validate
//	contracts/<event_type>/v<N>.samples/*.invalid.json payloads that must not
//
// A [Set] is loaded with [Load] and validates payloads with
// github.com/santhosh-tekuri/jsonschema/v6 (drafts 4 to 2020-12; the schema's
// $schema picks the draft, 2020-12 by default), which reports the location in
// the payload and the keyword that failed.
//
// The producer uses a Set with outbox.WithContracts (a payload that breaks its
// contract is refused before anything is written, as ferry.ErrInvalidEvent),
// the consumer with inbox.WithContracts (such a message is parked with reason
// schema, replayable once the contract or producer is fixed). [Check] compares
// two sets for breaking changes (ferry contract check, for CI); [RunSamples]
// runs the golden samples (ferry contract test).
//
// Error messages name the event type, version, JSON pointer into the payload
// and the rule (the JSON Schema keyword); they never contain payload values.
package contract

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
)

// Key names a contract.
type Key struct {
	EventType string
	Version   int
}

func (k Key) String() string { return fmt.Sprintf("%s v%d", k.EventType, k.Version) }

// Contract is one loaded schema.
type Contract struct {
	Key
	Path   string // the schema file
	Doc    any    // the parsed schema document
	Canon  []byte // canonical JSON of Doc (sorted keys), to tell two schemas apart
	schema *jsonschema.Schema
}

// Set is an immutable collection of contracts, safe for concurrent use.
type Set struct {
	byKey map[Key]*Contract
	types map[string]bool
}

// ErrUnknownVersion: the event type has contracts, but none for this version.
var ErrUnknownVersion = errors.New("contract: no contract for this schema version")

// ErrViolation: a payload does not match its contract; see *Violation.
var ErrViolation = errors.New("contract: payload violates its contract")

// Violation names where a payload breaks its contract and which rule.
type Violation struct {
	Key
	Path     string // JSON pointer into the payload ("" is the root)
	Rule     string // the JSON Schema keyword, e.g. "required", "minimum", "type"
	Schema   string // where the rule is in the schema (JSON pointer)
	Property string // for required: the missing property
}

func (v *Violation) Error() string {
	at := v.Path
	if at == "" {
		at = "/"
	}
	if v.Property != "" {
		return fmt.Sprintf("contract %s: at %s: rule %s: property %q is missing", v.Key, at, v.Rule, v.Property)
	}
	if v.Rule == "json" {
		return fmt.Sprintf("contract %s: payload is not valid JSON", v.Key)
	}
	return fmt.Sprintf("contract %s: at %s: rule %s (schema %s)", v.Key, at, v.Rule, v.Schema)
}

// Is reports ErrViolation.
func (v *Violation) Is(target error) bool { return target == ErrViolation }

var versionFile = regexp.MustCompile(`^v([1-9][0-9]*)\.json$`)
var samplesDir = regexp.MustCompile(`^v([1-9][0-9]*)\.samples$`)

// Load reads every dir/<event_type>/v<N>.json. A file or directory that does
// not follow the convention is an error naming it, so a typo is not a
// silently missing contract.
func Load(dir string) (*Set, error) {
	types, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("contract: load %s: %w", dir, err)
	}
	s := &Set{byKey: map[Key]*Contract{}, types: map[string]bool{}}
	for _, t := range types {
		if !t.IsDir() {
			if strings.HasPrefix(t.Name(), ".") || strings.EqualFold(t.Name(), "README.md") {
				continue
			}
			return nil, fmt.Errorf("contract: %s: expected a directory per event type (contracts/<event_type>/v<N>.json)", filepath.Join(dir, t.Name()))
		}
		tdir := filepath.Join(dir, t.Name())
		files, err := os.ReadDir(tdir)
		if err != nil {
			return nil, fmt.Errorf("contract: load %s: %w", tdir, err)
		}
		var sampleDirs []string
		for _, f := range files {
			name := f.Name()
			if m := samplesDir.FindStringSubmatch(name); m != nil && f.IsDir() {
				sampleDirs = append(sampleDirs, m[1])
				continue
			}
			m := versionFile.FindStringSubmatch(name)
			if m == nil || f.IsDir() {
				return nil, fmt.Errorf("contract: %s: name must be v<N>.json (N >= 1) or v<N>.samples/", filepath.Join(tdir, name))
			}
			v, _ := strconv.Atoi(m[1])
			c, err := compile(Key{t.Name(), v}, filepath.Join(tdir, name))
			if err != nil {
				return nil, err
			}
			s.byKey[c.Key] = c
			s.types[c.EventType] = true
		}
		for _, v := range sampleDirs {
			n, _ := strconv.Atoi(v)
			if _, ok := s.byKey[Key{t.Name(), n}]; !ok {
				return nil, fmt.Errorf("contract: %s: samples without a schema v%d.json", filepath.Join(tdir, "v"+v+".samples"), n)
			}
		}
	}
	return s, nil
}

func compile(k Key, path string) (*Contract, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("contract: %s: %w", path, err)
	}
	raw, err := os.ReadFile(abs)
	if err != nil {
		return nil, fmt.Errorf("contract: %s: %w", path, err)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("contract: %s: not valid JSON: %w", path, err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if err := c.AddResource(abs, doc); err != nil {
		return nil, fmt.Errorf("contract: %s: %w", path, err)
	}
	sch, err := c.Compile(abs)
	if err != nil {
		return nil, fmt.Errorf("contract: %s: not a valid JSON Schema: %w", path, err)
	}
	canon, err := json.Marshal(doc) // encoding/json sorts map keys
	if err != nil {
		return nil, fmt.Errorf("contract: %s: %w", path, err)
	}
	return &Contract{Key: k, Path: path, Doc: doc, Canon: canon, schema: sch}, nil
}

// Keys lists the contracts, by event type then version.
func (s *Set) Keys() []Key {
	out := make([]Key, 0, len(s.byKey))
	for k := range s.byKey {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].EventType != out[j].EventType {
			return out[i].EventType < out[j].EventType
		}
		return out[i].Version < out[j].Version
	})
	return out
}

// Get returns the contract of k.
func (s *Set) Get(k Key) (*Contract, bool) {
	c, ok := s.byKey[k]
	return c, ok
}

// Validate checks payload against the contract of (eventType, version). An
// event type with no contract at all is not governed and passes; a known
// type at a version without a contract fails with ErrUnknownVersion; a
// mismatch fails with a *Violation (ErrViolation).
func (s *Set) Validate(eventType string, version int, payload []byte) error {
	if s == nil || !s.types[eventType] {
		return nil
	}
	k := Key{eventType, version}
	c, ok := s.byKey[k]
	if !ok {
		return fmt.Errorf("contract %s: %w", k, ErrUnknownVersion)
	}
	return c.Validate(payload)
}

// Validate checks one payload against c.
func (c *Contract) Validate(payload []byte) error {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(payload))
	if err != nil {
		return &Violation{Key: c.Key, Rule: "json"}
	}
	err = c.schema.Validate(inst)
	if err == nil {
		return nil
	}
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return fmt.Errorf("contract %s: %w", c.Key, err)
	}
	leaf := firstLeaf(ve)
	v := &Violation{Key: c.Key, Path: pointer(leaf.InstanceLocation)}
	kp := leaf.ErrorKind.KeywordPath()
	if len(kp) > 0 {
		v.Rule = kp[0]
	}
	if i := strings.IndexByte(leaf.SchemaURL, '#'); i >= 0 {
		v.Schema = leaf.SchemaURL[i+1:]
	}
	if len(kp) > 0 {
		v.Schema += pointer(kp)
	}
	if v.Schema == "" {
		v.Schema = "/"
	}
	if r, ok := leaf.ErrorKind.(*kind.Required); ok && len(r.Missing) > 0 {
		v.Property = r.Missing[0]
	}
	return v
}

// firstLeaf follows the first cause down to the error that names the rule.
func firstLeaf(e *jsonschema.ValidationError) *jsonschema.ValidationError {
	for len(e.Causes) > 0 {
		e = e.Causes[0]
	}
	return e
}

func pointer(parts []string) string {
	var b strings.Builder
	for _, p := range parts {
		b.WriteByte('/')
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(p))
	}
	return b.String()
}
