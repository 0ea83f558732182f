package inbox

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/sqlite"
)

// Options are not generic; the one that names a transaction type
// (WithAuthorizer) is checked against the driver's by New, so a mismatch is
// a configuration error naming the field, not a silently ignored hook.
func TestAuthorizerOfAnotherTransactionTypeIsRefused(t *testing.T) {
	drv := sqlite.New(nil)
	h := func(context.Context, *sql.Tx, ferry.Event) error { return nil }
	_, err := New(drv, "c", h, WithWorkers(2), WithAuthorizer(func(context.Context, pgx.Tx, ferry.Event) error { return nil }))
	var ce *ferry.ConfigError
	if !errors.As(err, &ce) || ce.Field != "inbox.authorizer" || !strings.Contains(err.Error(), "pgx/v5.Tx") {
		t.Fatalf("err = %v, want a ConfigError for inbox.authorizer naming the types", err)
	}
	ib, err := New(drv, "c", h, WithAuthorizer(func(context.Context, *sql.Tx, ferry.Event) error { return errors.New("no") }))
	if err != nil {
		t.Fatal(err)
	}
	if ib.authorize == nil {
		t.Fatal("a matching authorizer was dropped")
	}
}
