// Package logattr holds Ferry's logging conventions, defined once:
//
//   - ErrKey: every error is logged under the key "err", through Err (or
//     slog.String(ErrKey, s) for an error already reduced to a sanitised
//     string). "err" is the key most Go code using slog writes, the name
//     of the variable it logs, and what Ferry's relay, effect worker, ops
//     and brokers already wrote when this was decided (#13 item 6); inbox
//     and console, which wrote "error", were changed.
//   - OrDefault: the one default-logger policy. A component given no
//     logger (or a nil one) logs to slog.Default() as it is when the
//     component is built, so warnings such as "relay cycle failed" reach
//     wherever the application sends its logs (stderr with Go's default
//     handler, at Info level and above) instead of being dropped. Pass
//     slog.New(slog.DiscardHandler) to silence a component.
//   - Context: a log line written where a context.Context is in scope uses
//     the …Context methods or LogAttrs(ctx, …), so a handler can attach the
//     trace and span ids of the active span.
//   - Logs carry ids, counts and durations, never payloads, headers or
//     secrets; RedactURL strips the password from a connection URL before
//     it is logged or printed.
//
// TestConventions (a go/parser walk over the module's non-test files)
// fails on a log call that breaks the first or third rule.
package logattr

import (
	"log/slog"
	"net/url"
	"strings"
)

// ErrKey is the key every error is logged under.
const ErrKey = "err"

// Err is the attribute for an error: key ErrKey, value err. A nil error
// gives an empty attribute, which slog handlers omit.
func Err(err error) slog.Attr {
	if err == nil {
		return slog.Attr{}
	}
	return slog.Any(ErrKey, err)
}

// OrDefault returns l, or slog.Default() when l is nil: the logger a
// component uses when its WithLogger option was not given.
func OrDefault(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.Default()
	}
	return l
}

// RedactURL returns a database or broker URL fit for a log line or an
// error message: the password of a URL's userinfo becomes "xxxxx"
// (url.URL.Redacted), as does a password=... (or sslpassword=...) query
// parameter or keyword/value DSN field ("host=h password=secret"). A string
// that does not parse as a URL but holds '@' loses everything before its
// last '@', so a malformed "user:secret@host" still hides the secret.
func RedactURL(raw string) string {
	if u, err := url.Parse(raw); err == nil && u.Scheme != "" && !strings.Contains(u.Opaque, "@") {
		q := u.Query()
		for k := range q {
			if strings.Contains(strings.ToLower(k), "password") {
				q.Set(k, "xxxxx")
				u.RawQuery = q.Encode()
			}
		}
		return u.Redacted()
	}
	if strings.Contains(raw, "=") && !strings.Contains(raw, "://") {
		f := strings.Fields(raw)
		for i, kv := range f {
			if k, _, ok := strings.Cut(kv, "="); ok && strings.Contains(strings.ToLower(k), "password") {
				f[i] = k + "=xxxxx"
			}
		}
		raw = strings.Join(f, " ")
	}
	if i := strings.LastIndex(raw, "@"); i >= 0 {
		return "xxxxx" + raw[i:]
	}
	return raw
}

// RedactBlobURL returns a blob store URL (gocloud.dev/blob: file://, s3://,
// gs://, azblob://) fit for results, logs and audit rows: without user info
// and without query parameters (some drivers take credentials or tokens
// there) except prefix, which says where in the bucket.
func RedactBlobURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable blob URL)"
	}
	u.User = nil
	q := url.Values{}
	if p := u.Query().Get("prefix"); p != "" {
		q.Set("prefix", p)
	}
	u.RawQuery = q.Encode()
	return u.String()
}
