package migrate_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/migrate"
)

const childEnv = "FERRY_MIGRATE_CHILD_DB"

// TestMigrateUpChild is the child process of TestConcurrentUpProcessesOnFreshSQLite.
func TestMigrateUpChild(t *testing.T) {
	path := os.Getenv(childEnv)
	if path == "" {
		t.Skip("child process of TestConcurrentUpProcessesOnFreshSQLite")
	}
	db, err := sqlite.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ran, err := migrate.Up(context.Background(), sqlite.New(db), ferry.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("applied=%d\n", len(ran))
}

// TestConcurrentUpProcessesOnFreshSQLite runs 8 processes, as `ferry migrate
// up` would, each migrating one fresh SQLite file at once, 20 times: every
// one must succeed, exactly one applies the migrations, and the schema ends
// at the latest version. Opening a fresh file used to fail here with
// SQLITE_BUSY ("migrate: begin: database is locked") before sqlite.Open
// retried such openings.
func TestConcurrentUpProcessesOnFreshSQLite(t *testing.T) {
	const workers, rounds = 8, 20
	ctx := context.Background()
	latest, err := migrate.Load(driver.SQLite, ferry.Tables{})
	if err != nil {
		t.Fatal(err)
	}
	for round := range rounds {
		path := filepath.Join(t.TempDir(), fmt.Sprintf("r%d.db", round))
		var wg sync.WaitGroup
		errs := make([]error, workers)
		outs := make([][]byte, workers)
		for g := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				cmd := exec.Command(os.Args[0], "-test.run=^TestMigrateUpChild$", "-test.v")
				cmd.Env = append(os.Environ(), childEnv+"="+path)
				outs[g], errs[g] = cmd.CombinedOutput()
			}()
		}
		wg.Wait()
		appliers := 0
		for g, err := range errs {
			if err != nil {
				t.Fatalf("round %d, process %d: %v\n%s", round, g, err, outs[g])
			}
			switch {
			case strings.Contains(string(outs[g]), fmt.Sprintf("applied=%d\n", len(latest))):
				appliers++
			case !strings.Contains(string(outs[g]), "applied=0\n"):
				t.Fatalf("round %d, process %d: no applied=0 or applied=%d in its output:\n%s", round, g, len(latest), outs[g])
			}
		}
		if appliers != 1 {
			t.Fatalf("round %d: %d processes applied the migrations, want exactly 1", round, appliers)
		}
		db, err := sqlite.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		st, err := migrate.CurrentStatus(ctx, sqlite.New(db), ferry.Tables{})
		_ = db.Close()
		if err != nil {
			t.Fatal(err)
		}
		if st.Current != latest[len(latest)-1].Version || len(st.Applied) != len(latest) || len(st.Pending) != 0 {
			t.Fatalf("round %d: status %+v, want every migration applied once", round, st)
		}
	}
}
