package ferry

import (
	"github.com/ferryhq/ferry/internal/ident"
)

// Tables says where Ferry's tables live: an optional Postgres schema and a
// name prefix (default "ferry_"). Both are validated as plain identifiers and
// quoted, so configuration can never inject SQL.
type Tables struct {
	// Schema is the Postgres schema; empty means the connection's
	// search_path. Must be empty on SQLite.
	Schema string
	// Prefix is prepended to every table name; default "ferry_".
	Prefix string
}

// DefaultTablePrefix prefixes Ferry's table names unless configured.
const DefaultTablePrefix = "ferry_"

// Check validates the names. Identifiers are lower case ASCII, digits and
// underscores, at most 40 bytes (Postgres allows 63; suffixes need room).
func (t Tables) Check() error {
	if t.Schema != "" && !ident.Valid(t.Schema, 40) {
		return &ConfigError{Field: "tables.schema", Reason: "must match [a-z_][a-z0-9_]* and be at most 40 bytes"}
	}
	p := t.prefix()
	if !ident.Valid(p, 40) {
		return &ConfigError{Field: "tables.prefix", Reason: "must match [a-z_][a-z0-9_]* and be at most 40 bytes"}
	}
	return nil
}

func (t Tables) prefix() string {
	if t.Prefix == "" {
		return DefaultTablePrefix
	}
	return t.Prefix
}

// Name returns the quoted, schema-qualified name of table base
// (e.g. "outbox" → "app"."ferry_outbox"). Call Check first.
func (t Tables) Name(base string) string {
	n := `"` + t.prefix() + base + `"`
	if t.Schema != "" {
		return `"` + t.Schema + `".` + n
	}
	return n
}

// Ident returns the quoted, unqualified, prefixed name for an index or
// constraint named base.
func (t Tables) Ident(base string) string { return `"` + t.prefix() + base + `"` }

// Bare returns the unquoted, prefixed name (for catalog lookups).
func (t Tables) Bare(base string) string { return t.prefix() + base }
