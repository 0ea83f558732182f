package relay

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/internal/testenv"
)

// TestPoolSizingWarning: New warns when the pool cannot serve the relay's
// workers, its lease loop and a LISTEN connection taken from the same pool
// (naming the numbers and the fix); a sufficient pool logs nothing.
func TestPoolSizingWarning(t *testing.T) {
	n := startEmbeddedNATS(t)
	pub := n.publisher(t)
	base := testenv.PostgresURL(t)
	for _, c := range []struct {
		maxConns string
		workers  int
		listen   bool
		want     []string
	}{
		{"2", 4, false, []string{"max conns 2 < 5 (relay workers 4 + the lease loop)", "pool_max_conns>=5", "WithWorkers(1)"}},
		{"5", 4, false, nil},
		{"5", 4, true, []string{"max conns 5 < 6 (relay workers 4 + the lease loop + the LISTEN connection)", "pool_max_conns>=6", "WithWorkers(3)"}},
		{"6", 4, true, nil},
	} {
		pool, err := pgxpool.New(context.Background(), testenv.WithParam(t, base, "pool_max_conns", c.maxConns))
		if err != nil {
			t.Fatal(err)
		}
		var buf testenv.Buffer
		log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
		opts := []Option{WithWorkers(c.workers), WithLogger(log)}
		if c.listen {
			opts = append(opts, WithListener(pool, "ferry_outbox"))
		}
		_, err = New(pgxv5.New(pool), pub, opts...)
		pool.Close()
		if err != nil {
			t.Fatal(err)
		}
		got := buf.String()
		if c.want == nil && got != "" {
			t.Fatalf("pool_max_conns %s, workers %d logged:\n%s", c.maxConns, c.workers, got)
		}
		for _, w := range c.want {
			if !strings.Contains(got, w) {
				t.Errorf("pool_max_conns %s: log lacks %q:\n%s", c.maxConns, w, got)
			}
		}
	}
}
