package main

import (
	"context"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/testenv"
)

// ferry relay sizes its Postgres pool for its workers, lease loop, LISTEN
// and cleanup (pgxpool's default is max(4, CPUs): on two cores the
// workers waited for connections), unless the URL sets pool_max_conns.
func TestRelayPoolSizedForWorkers(t *testing.T) {
	base := testenv.PostgresURL(t)
	for _, c := range []struct {
		url      string
		minConns int
		want     int
	}{
		{base, 7, 7},
		{testenv.WithParam(t, base, "pool_max_conns", "2"), 7, 2},
		{base, 0, -1}, // pgxpool's default, whatever the machine
	} {
		st, err := openDatabase(context.Background(), c.url, ferry.Tables{}, false, c.minConns)
		if err != nil {
			t.Fatal(err)
		}
		got := st.MaxConns()
		st.Close()
		if c.want >= 0 && got != c.want {
			t.Errorf("%s with minConns %d: pool max conns %d, want %d", redactURL(c.url), c.minConns, got, c.want)
		}
		if c.want < 0 && got < 4 {
			t.Errorf("default pool max conns %d, want pgxpool's default (>= 4)", got)
		}
	}
}
