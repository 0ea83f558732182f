// Package ident is Ferry's one rule for the SQL names it accepts from
// configuration (schema, table prefix, LISTEN/NOTIFY channel): lower-case
// ASCII letters, digits and underscores, not starting with a digit, so a
// name is safe unquoted in Postgres and SQLite alike.
package ident

// Pattern is the rule, for error messages.
const Pattern = "[a-z_][a-z0-9_]*"

// MaxChannel is Postgres's identifier limit (NAMEDATALEN-1), which bounds
// a NOTIFY channel.
const MaxChannel = 63

// Valid reports whether s matches Pattern and has 1..max bytes.
func Valid(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_' || 'a' <= c && c <= 'z':
		case '0' <= c && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}
