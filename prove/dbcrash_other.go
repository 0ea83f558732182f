//go:build !linux

package prove

import (
	"context"
	"errors"
)

// tempPostgres needs Linux (process groups with a parent-death signal);
// elsewhere the db-crash scenarios are not available.
type tempPostgres struct{ port int }

func pgServerMissing() string {
	return "needs Linux: the throwaway Postgres server is run with a parent-death signal (prctl)"
}

func startTempPostgres(context.Context) (*tempPostgres, error) {
	return nil, errors.New("prove: " + pgServerMissing())
}

func (p *tempPostgres) URL(string) string           { return "" }
func (p *tempPostgres) start(context.Context) error { return errors.New("prove: " + pgServerMissing()) }
func (p *tempPostgres) crash() error                { return errors.New("prove: " + pgServerMissing()) }
func (p *tempPostgres) freeze()                     {}
func (p *tempPostgres) close()                      {}
