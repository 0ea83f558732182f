//go:build linux

package prove

import (
	"context"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/testenv"
)

// TestInboxAckBeforeCommitDBCrash: under the database crash of db-crash,
// a consumer that acks each message on receipt, before its claim + effect
// transaction commits, loses applies — messages the broker will not
// redeliver and the database never recorded — while the same crash
// under the real consumer (db-crash, TestDBCrash) loses none.
func TestInboxAckBeforeCommitDBCrash(t *testing.T) {
	parallelUnlessRace(t)
	needPGServer(t)
	pg := testenv.PostgresURL(t)
	rep, err := Run(context.Background(), small(WithPostgres(pg), WithScenarios("control-inbox-ack-before-commit-db-crash"))...)
	if err != nil {
		t.Fatal(err)
	}
	var buf strings.Builder
	_ = rep.WriteTable(&buf)
	t.Log("\n" + buf.String())
	assertMatrix(t, rep, nil)
	r, _ := rep.Result("control-inbox-ack-before-commit-db-crash")
	if f := r.Figures; f.FaultsInjected != dbCrashes || f.Lost == 0 {
		t.Errorf("faults %d (want %d), lost %d (want > 0)", f.FaultsInjected, dbCrashes, f.Lost)
	}
	t.Logf("lost %d of %d committed", r.Figures.Lost, r.Figures.Committed)
}
