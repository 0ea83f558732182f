package archive_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/ops"
)

// TestArchiveCostFigures measures cleanup of 20,000 sent outbox rows in
// batches of 500 with and without a file:// archive (docs/ARCHIVE.md).
func TestArchiveCostFigures(t *testing.T) {
	if os.Getenv("FERRY_ARCHIVE_COST") == "" {
		t.Skip("figures for docs/ARCHIVE.md: set FERRY_ARCHIVE_COST=1")
	}
	for _, d := range []struct {
		name string
		mk   func(*testing.T) *env
	}{{"sqlite", newSQLite}, {"postgres", newPostgres}} {
		for _, withArchive := range []bool{false, true} {
			e := d.mk(t)
			const n = 20000
			var evs []ferry.Event
			for i := range n {
				evs = append(evs, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: fmt.Sprint(i % 500), EventType: "order.created", SchemaVersion: 1,
					Payload: []byte(fmt.Sprintf(`{"order":%d,"customer":"c-%d","amount":1234,"currency":"EUR","lines":[{"sku":"A","qty":1}]}`, i, i%97))})
				if len(evs) == 1000 {
					e.insert(t, evs...)
					evs = nil
				}
			}
			mustExec(t, e, fmt.Sprintf(`UPDATE %s SET status = 'sent', published_at = $1`, tn("outbox")), time.Now().Add(-300*time.Hour).UTC())
			opts := ops.CleanupOptions{Retention: retention, BatchSize: 500}
			dir := t.TempDir()
			tw := &timed{}
			if withArchive {
				tw.a = openDir(t, dir)
				opts.Archive = tw
			}
			start := time.Now()
			res, err := e.ops.Cleanup(context.Background(), opts, approve)
			el := time.Since(start)
			if err != nil || res.Outbox != n {
				t.Fatal(res, err)
			}
			var bytes int64
			_ = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
				if err == nil && !fi.IsDir() && filepath.Ext(p) == ".gz" {
					bytes += fi.Size()
				}
				return nil
			})
			t.Logf("%s archive=%v: %d rows in %s (%.0f rows/s), %d batches, archive data %d bytes (%.1f B/row), in Archive %s", d.name, withArchive, n, el.Round(time.Millisecond), float64(n)/el.Seconds(), res.Batches, bytes, float64(bytes)/n, tw.d.Round(time.Millisecond))
		}
	}
}

type timed struct {
	a ops.Archiver
	d time.Duration
}

func (t *timed) Archive(ctx context.Context, b ops.ArchiveBatch) error {
	s := time.Now()
	err := t.a.Archive(ctx, b)
	t.d += time.Since(s)
	return err
}
func (t *timed) Location() string { return t.a.Location() }
