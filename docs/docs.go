// Package docs embeds the documents Ferry serves to agents (ferry mcp):
// the guarantee table (GUARANTEES.md, kept identical to the README's
// Guarantees section by a test) and the operations runbooks
// (OPERATIONS.md).
package docs

import _ "embed"

// Guarantees is docs/GUARANTEES.md.
//
//go:embed GUARANTEES.md
var Guarantees string

// Operations is docs/OPERATIONS.md: the runbooks.
//
//go:embed OPERATIONS.md
var Operations string
