package testenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ThrowawayPostgres is a Postgres cluster a test created for itself: its own
// data directory under the test's temp dir, its own loopback port, stopped
// and removed at cleanup. Tests that change server-wide settings
// (ALTER SYSTEM, restarts) use it so they never disturb the shared server or
// the tests running against it.
type ThrowawayPostgres struct {
	// URL connects to the cluster's "postgres" database as its superuser.
	URL string
	// Port is the TCP port on 127.0.0.1.
	Port int
	// DataDir is the cluster's data directory.
	DataDir string
}

// NewThrowawayPostgres runs initdb and starts a private Postgres cluster
// with the given extra server settings (name → value, e.g. wal_level →
// logical). It needs the server binaries (initdb, pg_ctl); when they are
// missing the test is skipped, or failed with FERRY_REQUIRE_SERVICES=1.
// Postgres refuses to run as root, so as root the cluster runs as the
// "postgres" OS user.
func NewThrowawayPostgres(t testing.TB, settings map[string]string) *ThrowawayPostgres {
	t.Helper()
	bin, err := postgresBinDir()
	if err != nil {
		Unavailable(t, "throwaway Postgres cluster: %v", err)
	}
	runAs, err := postgresOSUser()
	if err != nil {
		Unavailable(t, "throwaway Postgres cluster: %v", err)
	}
	// Not t.TempDir: the directory must be reachable by the postgres user,
	// and t.TempDir's parents are 0700 to root.
	dir, err := os.MkdirTemp("", "ferry-pg-")
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	data := filepath.Join(dir, "data")
	if runAs != nil {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatalf("testenv: %v", err)
		}
		if err := os.Chown(dir, runAs.uid, runAs.gid); err != nil {
			t.Fatalf("testenv: chown %s: %v", dir, err)
		}
	}
	port, err := freePort()
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(filepath.Join(bin, name), args...)
		if runAs != nil {
			cmd = exec.Command("runuser", append([]string{"-u", runAs.name, "--", filepath.Join(bin, name)}, args...)...)
		}
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("testenv: %s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
	}
	run("initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8")

	opts := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"port":                    strconv.Itoa(port),
		"unix_socket_directories": dir,
		"fsync":                   "off",
		"max_connections":         "50",
	}
	for k, v := range settings {
		opts[k] = v
	}
	keys := make([]string, 0, len(opts))
	for k := range opts {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var o []string
	for _, k := range keys {
		o = append(o, fmt.Sprintf("-c %s=%s", k, opts[k]))
	}
	logFile := filepath.Join(dir, "server.log")
	run("pg_ctl", "-D", data, "-l", logFile, "-w", "-t", "60", "-o", strings.Join(o, " "), "start")
	t.Cleanup(func() {
		cmd := exec.Command(filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop")
		if runAs != nil {
			cmd = exec.Command("runuser", "-u", runAs.name, "--", filepath.Join(bin, "pg_ctl"), "-D", data, "-m", "immediate", "-w", "stop")
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("testenv: stop throwaway Postgres: %v\n%s", err, out)
		}
	})
	u := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, u)
	if err == nil {
		err = pool.Ping(ctx)
		pool.Close()
	}
	if err != nil {
		log, _ := os.ReadFile(logFile)
		t.Fatalf("testenv: throwaway Postgres on port %d: %v\n%s", port, err, log)
	}
	return &ThrowawayPostgres{URL: u, Port: port, DataDir: data}
}

type osUser struct {
	name     string
	uid, gid int
}

// postgresOSUser is the user the cluster runs as: nil (the current user)
// unless we are root, which Postgres refuses.
func postgresOSUser() (*osUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root and no postgres OS user to run the server as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	if _, err := exec.LookPath("runuser"); err != nil {
		return nil, fmt.Errorf("running as root and no runuser to drop privileges: %w", err)
	}
	return &osUser{name: u.Username, uid: uid, gid: gid}, nil
}

// postgresBinDir finds initdb and pg_ctl: FERRY_TEST_PG_BINDIR, then
// pg_config --bindir, then Debian's /usr/lib/postgresql/<version>/bin
// (newest first), then PATH.
func postgresBinDir() (string, error) {
	has := func(d string) bool {
		for _, n := range []string{"initdb", "pg_ctl"} {
			if fi, err := os.Stat(filepath.Join(d, n)); err != nil || fi.IsDir() {
				return false
			}
		}
		return true
	}
	if d := os.Getenv("FERRY_TEST_PG_BINDIR"); d != "" {
		if has(d) {
			return d, nil
		}
		return "", fmt.Errorf("FERRY_TEST_PG_BINDIR=%s has no initdb and pg_ctl", d)
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); has(d) {
			return d, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if has(d) {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil && has(filepath.Dir(p)) {
		return filepath.Dir(p), nil
	}
	return "", fmt.Errorf("no initdb/pg_ctl found (set FERRY_TEST_PG_BINDIR, or install the Postgres server package)")
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
