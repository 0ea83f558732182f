package outbox_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/producebench"
	"github.com/ferryhq/ferry/internal/testenv"
)

// BenchmarkProduce compares (a) a business transaction alone, (b) the same
// plus a hand-written outbox INSERT and (c) the same through Ferry with
// per-aggregate sequencing, at 1, 8 and 32 concurrent clients. The target is
// (c) >= 0.95 x (b); see docs/PERFORMANCE.md.
//
//	go test -run '^$' -bench BenchmarkProduce -benchtime 3s ./outbox/
func BenchmarkProduce(b *testing.B) {
	s := testenv.NewPostgresSchema(b)
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(s.URL)
	if err != nil {
		b.Fatal(err)
	}
	cfg.MaxConns = 40
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if err := producebench.Setup(ctx, pool, ferry.Tables{}); err != nil {
		b.Fatal(err)
	}
	r, err := producebench.New(pool, ferry.Tables{}, "")
	if err != nil {
		b.Fatal(err)
	}
	for _, clients := range []int{1, 8, 32} {
		for _, v := range producebench.Variants {
			b.Run(fmt.Sprintf("clients=%d/%s", clients, v), func(b *testing.B) {
				var wg sync.WaitGroup
				work := make(chan struct{}, b.N)
				for range b.N {
					work <- struct{}{}
				}
				close(work)
				cpu0 := producebench.ReadCPU()
				b.ResetTimer()
				for range clients {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range work {
							if err := r.Run(ctx, v); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				cpu1 := producebench.ReadCPU()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tx/s")
				// On a CPU-bound machine these show where a throughput
				// difference comes from (server: the local Postgres instance).
				if cpu0.Server >= 0 && cpu1.Server >= 0 {
					b.ReportMetric(float64(cpu1.Server-cpu0.Server)/float64(time.Microsecond)/float64(b.N), "server-µs/tx")
				}
				if cpu0.Client >= 0 && cpu1.Client >= 0 {
					b.ReportMetric(float64(cpu1.Client-cpu0.Client)/float64(time.Microsecond)/float64(b.N), "client-µs/tx")
				}
			})
		}
	}
}
