//go:build linux

package prove

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/testenv"
)

// needPGServer skips (or, with FERRY_REQUIRE_SERVICES=1, fails) without
// the Postgres server binaries the throwaway server is made from.
func needPGServer(t *testing.T) {
	t.Helper()
	if why := pgServerMissing(); why != "" {
		testenv.Unavailable(t, "db-crash: %s", why)
	}
}

// TestDBCrash runs the database crash on prove's own Postgres server:
// the real pipeline loses, duplicates and invents nothing through two
// SIGKILLs of the server, every unknown commit outcome resolves, and the
// dual-write control shows phantoms. No server directory is left behind.
func TestDBCrash(t *testing.T) {
	needPGServer(t)
	pg := testenv.PostgresURL(t)
	before := tempPGDirs(t)
	rep, err := Run(context.Background(), small(WithPostgres(pg), WithScenarios("db-crash", "control-dual-write-db-crash"))...)
	if err != nil {
		t.Fatal(err)
	}
	var buf strings.Builder
	_ = rep.WriteTable(&buf)
	t.Log("\n" + buf.String())
	assertMatrix(t, rep, nil)
	r, _ := rep.Result("db-crash")
	f := r.Figures
	if f.FaultsInjected != dbCrashes || !strings.Contains(r.Note, "SIGKILLed") {
		t.Errorf("db-crash: faults %d, note %q", f.FaultsInjected, r.Note)
	}
	if f.Unknown == 0 || f.Unknown != f.UnknownCommitted+f.UnknownAbsent {
		t.Errorf("db-crash: unknown %d = %d committed + %d absent does not add up", f.Unknown, f.UnknownCommitted, f.UnknownAbsent)
	}
	t.Logf("db-crash: committed %d, unknown %d (committed %d / absent %d), duplicate publishes %d, deliveries %d",
		f.Committed, f.Unknown, f.UnknownCommitted, f.UnknownAbsent, f.DuplicatePublishes, f.DuplicateDeliveries)
	assertNoOrphanDirs(t, before)
}

// A throwaway mariadbd must not touch the machine's MariaDB: a starting
// mariadbd deletes every "#sql*" file in its tmpdir (temporary tables left
// by an earlier run of itself), and with the default /tmp those were the
// live temporary tables of the machine's server, which crashed (signal 11
// after "Error on delete of '/tmp/#sql-temptable-…'") while the relay's and
// prove's MySQL tests ran on it. A canary named like one, owned by the
// server's OS user, survives a throwaway server's crash and restart.
// Without the throwaway server's own --tmpdir the restart deletes it (the
// test fails on the code before the fix).
func TestTempMariaDBLeavesSharedTmpAlone(t *testing.T) {
	if why := mariadbServerMissing(); why != "" {
		testenv.Unavailable(t, "throwaway mariadbd: %s", why)
	}
	canary := filepath.Join(os.TempDir(), "#sql-temptable-ferrycanary-"+strconv.Itoa(os.Getpid())+".MAI")
	if err := os.WriteFile(canary, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(canary)
	p, err := startTempServer(context.Background(), serverMariaDB)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	if p.cred != nil {
		if err := os.Chown(canary, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.crash(); err != nil {
		t.Fatal(err)
	}
	if err := p.start(context.Background()); err != nil {
		t.Fatalf("restart after crash: %v", err)
	}
	if _, err := os.Stat(canary); err != nil {
		t.Fatalf("the throwaway mariadbd deleted %s from the shared tmpdir: %v", canary, err)
	}
}

// TestDBCrashMariaDB: the same on a MySQL stack, whose scenarios get a
// throwaway mariadbd (mariadb-install-db, own datadir and port).
func TestDBCrashMariaDB(t *testing.T) {
	if why := mariadbServerMissing(); why != "" {
		testenv.Unavailable(t, "db-crash on MariaDB: %s", why)
	}
	my := testenv.MySQLURL(t)
	before := tempPGDirs(t)
	rep, err := Run(context.Background(), small(WithDatabaseURL(my), WithScenarios("db-crash", "control-dual-write-db-crash"))...)
	if err != nil {
		t.Fatal(err)
	}
	var buf strings.Builder
	_ = rep.WriteTable(&buf)
	t.Log("\n" + buf.String())
	assertMatrix(t, rep, nil)
	r, _ := rep.Result("db-crash")
	if f := r.Figures; f.FaultsInjected != dbCrashes || !strings.Contains(r.Note, "throwaway mariadb") || f.Unknown == 0 || f.Unknown != f.UnknownCommitted+f.UnknownAbsent {
		t.Errorf("db-crash on mariadb: note %q, figures %+v", r.Note, f)
	}
	assertNoOrphanDirs(t, before)
}

// TestDBCrashNeedsPostgres: on SQLite the scenarios say why they cannot
// run instead of passing vacuously.
func TestDBCrashNeedsPostgres(t *testing.T) {
	rep, err := Run(context.Background(), small(WithScenarios("db-crash", "control-dual-write-db-crash"))...)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rep.Results {
		if r.Status != StatusNotAvailable || !strings.Contains(r.Note, "needs Postgres") {
			t.Errorf("%s: %s %q", r.Scenario, r.Status, r.Note)
		}
	}
}

// TestTempPostgresSurvivesKilledOwner: a process that started a throwaway
// server is SIGKILLed; its server dies with it (parent-death signal), the
// next start sweeps the dead owner's directory, and a new server starts
// and survives a crash and restart on the same port.
func TestTempPostgresSurvivesKilledOwner(t *testing.T) {
	needPGServer(t)
	testKilledOwner(t, serverPostgres, "TestTempPostgresSurvivesKilledOwner", func(_, data string) []string {
		return []string{filepath.Join(data, "postmaster.pid")}
	})
}

// testKilledOwner is TestTempPostgresSurvivesKilledOwner for a server of
// kind, run again as the child test name; pidFiles names the files
// holding the pids that must die with the child.
func testKilledOwner(t *testing.T, kind, name string, pidFiles func(dir, data string) []string) {
	if os.Getenv("FERRY_PROVE_TEMP_PG_CHILD") == "1" {
		p, err := startTempServer(context.Background(), kind)
		if err != nil {
			t.Fatal(err)
		}
		_ = os.WriteFile(os.Getenv("FERRY_PROVE_TEMP_PG_OUT"), []byte(p.dir+"\n"+p.data), 0o600)
		time.Sleep(2 * time.Minute) // killed by the parent test
		return
	}
	out := filepath.Join(t.TempDir(), "child")
	child := exec.Command(os.Args[0], "-test.run=^"+name+"$")
	child.Env = append(os.Environ(), "FERRY_PROVE_TEMP_PG_CHILD=1", "FERRY_PROVE_TEMP_PG_OUT="+out)
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	var dir, data string
	for i := 0; i < 1500 && dir == ""; i++ { // a RabbitMQ node may take up to rabbitBootLimit
		if b, err := os.ReadFile(out); err == nil && strings.Contains(string(b), "\n") {
			dir, data, _ = strings.Cut(string(b), "\n")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if dir == "" {
		_ = child.Process.Kill()
		_ = child.Wait()
		t.Fatal("child never started its server")
	}
	var pids []string
	for _, f := range pidFiles(dir, data) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		pid, _, _ := strings.Cut(string(b), "\n")
		pids = append(pids, strings.TrimSpace(pid))
	}
	_ = child.Process.Signal(syscall.SIGKILL)
	_ = child.Wait()
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the killed owner's dir should still be there for the sweep: %v", err)
	}
	for _, pid := range pids {
		alive := true
		for i := 0; i < 200 && alive; i++ {
			_, err := os.Stat("/proc/" + pid)
			alive = err == nil
			time.Sleep(25 * time.Millisecond)
		}
		if alive {
			t.Errorf("%s process %s outlived its killed owner", kind, pid)
		}
	}

	p, err := startTempServer(context.Background(), kind)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("dead owner's dir %s not swept: %v", dir, err)
	}
	if err := p.crash(); err != nil {
		t.Fatal(err)
	}
	if err := p.start(context.Background()); err != nil {
		t.Fatalf("restart after crash: %v", err)
	}
	mine := p.dir
	p.close()
	if _, err := os.Stat(mine); !os.IsNotExist(err) {
		t.Errorf("own dir %s not removed at close: %v", mine, err)
	}
}

// assertNoOrphanDirs fails for each throwaway server directory made since
// before that is still there without a live owner (its lock free): a
// concurrent run's directories, locked by their owner, are not ours.
func assertNoOrphanDirs(t *testing.T, before map[string]bool) {
	t.Helper()
	for d := range tempPGDirs(t) {
		if before[d] {
			continue
		}
		f, err := os.OpenFile(filepath.Join(d, "owner.lock"), os.O_RDWR, 0)
		if err != nil {
			continue // no lock file yet: a run starting now
		}
		held := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil
		_ = f.Close()
		if held {
			continue // a live run's
		}
		t.Errorf("throwaway server dir %s left behind", d)
	}
}

func tempPGDirs(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, prefix := range []string{tempPGPrefix, tempRabbitPrefix} {
		m, err := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range m {
			out[d] = true
		}
	}
	return out
}

// TestTempServerRestartsWhenPortBrieflyTaken: a throwaway Postgres
// restarted after its crash while something else holds its port for a
// moment (a producer's reconnect given the port as its own) exits at
// start; start runs it again until the port is free, instead of failing
// the scenario on one bind (a db-crash run in CI: the server never came
// back, and the workload gave up after 30 s).
func TestTempServerRestartsWhenPortBrieflyTaken(t *testing.T) {
	needPGServer(t)
	p, err := startTempServer(context.Background(), serverPostgres)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	if err := p.crash(); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p.port))
	if err != nil {
		t.Fatalf("hold the port: %v", err)
	}
	released := make(chan struct{})
	go func() {
		time.Sleep(1500 * time.Millisecond)
		_ = l.Close()
		close(released)
	}()
	t0 := time.Now()
	if err := p.start(context.Background()); err != nil {
		t.Fatalf("restart with the port held for 1.5 s: %v", err)
	}
	<-released
	if took := time.Since(t0); took < 1500*time.Millisecond {
		t.Fatalf("started in %s while the port was held: the test held nothing", took)
	}
	if err := p.ping(context.Background()); err != nil {
		t.Fatalf("ping after the restart: %v", err)
	}
}
