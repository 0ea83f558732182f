//go:build linux

package prove

import (
	"context"
	"database/sql"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/testenv"
)

// TestTempPostgresCrashDetaches: after a crash, no process is attached
// to the cluster's shared memory any more (the condition a restart on
// the same data directory checks), even with backends busy writing, and
// the restart takes connections; and no process working in the data
// directory outlives it, parent or not. A kill that returned with a
// backend still attached failed the project's CI ("pre-existing shared
// memory block … is still in use").
func TestTempPostgresCrashDetaches(t *testing.T) {
	if why := pgServerMissing(); why != "" {
		testenv.Unavailable(t, "throwaway postgres: %s", why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	pg, err := startTempServer(ctx, serverPostgres)
	if err != nil {
		t.Fatal(err)
	}
	defer pg.close()
	for round := 1; round <= 2; round++ {
		id, ok := pgShmID(filepath.Join(pg.data, "postmaster.pid"))
		if !ok {
			t.Fatalf("round %d: no shared memory id in postmaster.pid", round)
		}
		db, err := sql.Open("pgx", pg.URL())
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(4)
		if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS w (id bigserial primary key, v text)`); err != nil {
			t.Fatal(err)
		}
		// Four backends writing when the kill comes.
		stop := make(chan struct{})
		done := make(chan struct{}, 4)
		for i := 0; i < 4; i++ {
			go func() {
				defer func() { done <- struct{}{} }()
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, _ = db.ExecContext(ctx, `INSERT INTO w (v) SELECT repeat('x', 1000) FROM generate_series(1, 200)`)
				}
			}()
		}
		// A process working in the data directory that is no child of
		// the postmaster: what a backend forked while the postmaster was
		// being stopped looked like to the scan by parent.
		stray := exec.Command("sleep", "600")
		stray.Dir = pg.data
		if err := stray.Start(); err != nil {
			t.Fatal(err)
		}
		strayDone := make(chan struct{})
		go func() { _ = stray.Wait(); close(strayDone) }()
		time.Sleep(300 * time.Millisecond)
		if n := shmAttached(id); n < 5 {
			t.Fatalf("round %d: %d processes attached to segment %d while running, want the postmaster, its helpers and 4 backends", round, n, id)
		}
		if err := pg.crash(); err != nil {
			t.Fatal(err)
		}
		if n := shmAttached(id); n != 0 {
			t.Fatalf("round %d: %d processes still attached to segment %d after the crash returned", round, n, id)
		}
		select {
		case <-strayDone:
		case <-time.After(5 * time.Second):
			_ = stray.Process.Kill()
			t.Fatalf("round %d: a process in the data directory outlived the crash", round)
		}
		close(stop)
		for i := 0; i < 4; i++ {
			<-done
		}
		db.Close()
		if err := pg.start(ctx); err != nil {
			t.Fatalf("round %d: restart: %v", round, err)
		}
	}
}
