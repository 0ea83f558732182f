//go:build linux

package prove

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	ferrymysql "github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/internal/ownerdir"
)

// pgServerBin is where Debian's packages put the Postgres 15 server
// binaries (postgresql-15); the db-crash scenarios need initdb and
// postgres from it. FERRY_PROVE_PG_BIN overrides the directory.
const pgServerBin = "/usr/lib/postgresql/15/bin"

// tempPGPrefix names every throwaway cluster's directory under
// os.TempDir(): <prefix>XXXX/{owner.lock,data,postgres.log}.
const tempPGPrefix = "ferry-prove-pg-"

// tempRabbitPrefix names every throwaway RabbitMQ node's directory under
// os.TempDir(): <prefix>XXXX/{owner.lock,mnesia,log,server.log,…}.
const tempRabbitPrefix = "ferry-prove-rabbit-"

// rabbitmqServerScript is the RabbitMQ server's own start script (Debian's
// rabbitmq-server package; FERRY_PROVE_RABBITMQ_SERVER overrides it). Not
// /usr/sbin/rabbitmq-server: that is Debian's wrapper, which as the
// rabbitmq user redirects the output to /var/log/rabbitmq/startup_log
// (the machine's node's) and as root re-runs itself through su with HOME
// reset to /var/lib/rabbitmq (the machine's node's Erlang cookie).
const rabbitmqServerScript = "/usr/lib/rabbitmq/bin/rabbitmq-server"

// rabbitBootLimit bounds a throwaway RabbitMQ node's boot to its first
// AMQP login (measured on the shared 2-core machine: first boot 6.1–17.5 s,
// restart after the SIGKILL 4.8–8.6 s).
const rabbitBootLimit = 60 * time.Second

// MariaDB's server and installer, as Debian's mariadb-server installs them.
const (
	mariadbd         = "/usr/sbin/mariadbd"
	mariadbInstallDB = "/usr/bin/mariadb-install-db"
)

// mariadbServerMissing says why no throwaway MariaDB can be made here.
func mariadbServerMissing() string {
	for _, p := range []string{mariadbd, mariadbInstallDB} {
		if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
			return fmt.Sprintf("needs the MariaDB server binaries (%s not found; install mariadb-server)", p)
		}
	}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("mysql"); err != nil {
			return "running as root: needs a `mysql` OS user to run the throwaway mariadbd as"
		}
	}
	return ""
}

// rabbitServer is the RabbitMQ start script the throwaway node runs.
func rabbitServer() string {
	if p := os.Getenv("FERRY_PROVE_RABBITMQ_SERVER"); p != "" {
		return p
	}
	return rabbitmqServerScript
}

// epmdBin is Erlang's port mapper daemon; the throwaway node gets one of
// its own on a free port.
func epmdBin() string {
	if p, err := exec.LookPath("epmd"); err == nil {
		return p
	}
	return "/usr/lib/erlang/bin/epmd"
}

// rabbitServerMissing says why no throwaway RabbitMQ node can be made
// here ("" if one can).
func rabbitServerMissing() string {
	for _, p := range []string{rabbitServer(), epmdBin()} {
		if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
			return fmt.Sprintf("needs the RabbitMQ server (%s not found; install rabbitmq-server or set FERRY_PROVE_RABBITMQ_SERVER)", p)
		}
	}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("rabbitmq"); err != nil {
			return "running as root: needs a `rabbitmq` OS user to run the throwaway node as"
		}
	}
	return ""
}

// pgBinDir is the directory the server binaries are taken from.
func pgBinDir() string {
	if d := os.Getenv("FERRY_PROVE_PG_BIN"); d != "" {
		return d
	}
	return pgServerBin
}

// pgServerMissing says why no throwaway Postgres can be made here ("" if
// one can).
func pgServerMissing() string {
	for _, b := range []string{"initdb", "postgres"} {
		p := filepath.Join(pgBinDir(), b)
		if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
			return fmt.Sprintf("needs the Postgres server binaries (%s not found; install postgresql-15 or set FERRY_PROVE_PG_BIN)", p)
		}
	}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			return "running as root, and initdb refuses root: needs a `postgres` OS user to run the throwaway server as"
		}
	}
	return ""
}

// tempServer is a Postgres cluster prove owns: its own data directory
// in a temp dir, its own loopback port, fsync on. It is started as the
// `postgres` OS user when prove runs as root (initdb and postgres refuse
// root); a crash stops, then kills, the postmaster and every backend at
// once (found by parent: each Postgres child calls setsid()), and the
// postmaster has a parent-death signal so
// that it dies with prove even when prove is SIGKILLed. The directory
// holds a lock (flock) for as long as its owner lives; sweepTempServers
// removes the directories, and kills the servers, of owners that died.
//
// A RabbitMQ node (serverRabbitMQ) is the same with its own node name,
// AMQP and distribution ports, and an epmd of its own on a third port
// (epmd, which outlives node crashes), so that nothing of the machine's
// node is shared: not its epmd, its cookie, its configuration or its logs.
type tempServer struct {
	kind               string // serverPostgres, serverMariaDB or serverRabbitMQ
	dir, data, logPath string
	port               int
	cred               *syscall.Credential
	lock               *os.File
	cmd                *exec.Cmd
	exited             chan struct{}
	lastBoot           time.Duration // the last start's, until the first connection

	// RabbitMQ only.
	node               string // ferry-prove-<hex>@localhost
	distPort, epmdPort int
	epmd               *exec.Cmd
}

// Kinds of throwaway server.
const (
	serverPostgres = "postgres"
	serverMariaDB  = "mariadb"
	serverRabbitMQ = "rabbitmq"
)

// URL is the server's superuser URL, for the stack (stack.onServer).
func (p *tempServer) URL() string {
	if p.kind == serverRabbitMQ {
		// RabbitMQ's default guest user may log in over loopback only.
		return fmt.Sprintf("amqp://guest:guest@127.0.0.1:%d/", p.port)
	}
	if p.kind == serverMariaDB {
		return fmt.Sprintf("mysql://root@127.0.0.1:%d/mysql", p.port)
	}
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", p.port)
}

// startTempServer sweeps dead owners' leftovers, then initialises and
// starts a new server of kind and waits until it accepts connections.
func startTempServer(ctx context.Context, kind string) (_ *tempServer, err error) {
	osUser, prefix := "postgres", tempPGPrefix
	switch kind {
	case serverMariaDB:
		osUser = "mysql"
		if why := mariadbServerMissing(); why != "" {
			return nil, errors.New("prove: " + why)
		}
	case serverRabbitMQ:
		osUser, prefix = "rabbitmq", tempRabbitPrefix
		if why := rabbitServerMissing(); why != "" {
			return nil, errors.New("prove: " + why)
		}
	default:
		if why := pgServerMissing(); why != "" {
			return nil, errors.New("prove: " + why)
		}
	}
	sweepTempServers()
	dir, err := os.MkdirTemp("", prefix+"*")
	if err != nil {
		return nil, fmt.Errorf("prove: temp %s dir: %w", kind, err)
	}
	p := &tempServer{kind: kind, dir: dir, data: filepath.Join(dir, "data"), logPath: filepath.Join(dir, "server.log")}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if p.lock, err = ownerdir.Lock(dir); err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		u, err := user.Lookup(osUser)
		if err != nil {
			return nil, fmt.Errorf("prove: temp %s: os user %s: %w", kind, osUser, err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, fmt.Errorf("prove: temp postgres: chown %s: %w", dir, err)
		}
	}
	if kind == serverRabbitMQ {
		if err := p.initRabbit(); err != nil {
			return nil, err
		}
	} else {
		initdb := p.command(ctx, filepath.Join(pgBinDir(), "initdb"), "-D", p.data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-instructions")
		if kind == serverMariaDB {
			if err := p.mkdirOwned(p.tmpdir()); err != nil {
				return nil, err
			}
			initdb = p.command(ctx, mariadbInstallDB, "--no-defaults", "--datadir="+p.data, "--tmpdir="+p.tmpdir(),
				"--auth-root-authentication-method=normal", "--skip-test-db")
		}
		if out, err := initdb.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("prove: %s: %w: %s", filepath.Base(initdb.Path), err, tail(string(out), 600))
		}
	}
	// A free port, taken again by the server at once; if another process
	// takes it in between, the start fails and is retried on a new one.
	for attempt := 0; ; attempt++ {
		if p.port, err = freePort(); err != nil {
			return nil, err
		}
		if kind == serverRabbitMQ {
			if p.distPort, err = freePort(); err == nil {
				err = p.startEpmd()
			}
		}
		if err == nil {
			err = p.start(ctx)
		}
		if err == nil {
			return p, nil
		}
		if attempt == 2 || ctx.Err() != nil {
			return nil, err
		}
	}
}

// tmpdir is a throwaway MariaDB's own temporary directory, inside its dir.
func (p *tempServer) tmpdir() string { return filepath.Join(p.dir, "tmp") }

// mkdirOwned makes dir for the server's OS user.
func (p *tempServer) mkdirOwned(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fmt.Errorf("prove: temp %s: %w", p.kind, err)
	}
	if p.cred != nil {
		if err := os.Chown(dir, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
			return fmt.Errorf("prove: temp %s: chown %s: %w", p.kind, dir, err)
		}
	}
	return nil
}

func (p *tempServer) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	c := exec.CommandContext(ctx, name, args...)
	c.Dir = p.dir
	c.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	c.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	return c
}

// errExitedAtStart: the server process ended before it took a connection.
var errExitedAtStart = errors.New("exited at start")

// start runs the postmaster on the data directory and port and waits
// until it accepts connections (crash recovery included), within 30 s
// (a RabbitMQ node: until it takes an AMQP login, within rabbitBootLimit).
// A server that exits at start is started again, every 250 ms until the
// limit: a restart on the same port after a crash can find the port
// briefly taken (the producers reconnecting to it all the while; a
// loopback connect can be given the port it dials as its own and connect
// to itself), and then the whole scenario failed on one bind.
func (p *tempServer) start(ctx context.Context) error {
	limit := 30 * time.Second
	if p.kind == serverRabbitMQ {
		limit = rabbitBootLimit
	}
	deadline := time.Now().Add(limit)
	for {
		err := p.startOnce(ctx, limit, deadline)
		if !errors.Is(err, errExitedAtStart) || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		sleepCtx(ctx, 250*time.Millisecond)
	}
}

func (p *tempServer) startOnce(ctx context.Context, limit time.Duration, deadline time.Time) error {
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("prove: temp %s log: %w", p.kind, err)
	}
	defer logf.Close()
	// Not CommandContext: the server must outlive a cancelled scenario
	// context until close kills it (the checker reads after the run).
	c := exec.Command(filepath.Join(pgBinDir(), "postgres"), "-D", p.data, "-p", strconv.Itoa(p.port),
		"-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories=", "-c", "fsync=on",
		"-c", "synchronous_commit=on", "-c", "full_page_writes=on", "-c", "shared_buffers=16MB", "-c", "max_connections=100")
	if p.kind == serverMariaDB {
		// --skip-grant-tables: every client is a superuser (loopback only,
		// a throwaway server). Durability as shipped: InnoDB flushes its
		// log at every commit; no binary log.
		// --tmpdir of its own: a starting mariadbd deletes every "#sql*"
		// file in its tmpdir (leftover temporary tables), and with the
		// default /tmp that included the live temporary tables of the
		// machine's MariaDB, which then crashed (signal 11 after "Error on
		// delete of '/tmp/#sql-temptable-…'") under the tests running on it.
		c = exec.Command(mariadbd, "--no-defaults", "--datadir="+p.data, "--tmpdir="+p.tmpdir(), "--port="+strconv.Itoa(p.port),
			"--bind-address=127.0.0.1", "--socket="+filepath.Join(p.dir, "mariadbd.sock"), "--pid-file="+filepath.Join(p.dir, "mariadbd.pid"),
			"--skip-grant-tables", "--skip-log-bin", "--innodb-flush-log-at-trx-commit=1", "--innodb-buffer-pool-size=32M", "--max-connections=200")
	}
	env := append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	if p.kind == serverRabbitMQ {
		c, env = exec.Command(rabbitServer()), append(env, p.rabbitEnv()...)
	}
	c.Dir, c.Env, c.Stdout, c.Stderr = p.dir, env, logf, logf
	c.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred, Setpgid: true, Pdeathsig: syscall.SIGKILL}
	started := time.Now()
	if err := c.Start(); err != nil {
		return fmt.Errorf("prove: start %s: %w", p.kind, err)
	}
	p.cmd, p.exited = c, make(chan struct{})
	go func(done chan struct{}) { _ = c.Wait(); close(done) }(p.exited)
	if p.kind == serverRabbitMQ {
		// For the sweep: the node's pid (the script execs erl, which execs
		// beam.smp: one process, the parent-death signal kept).
		_ = os.WriteFile(filepath.Join(p.dir, "server.pid"), []byte(strconv.Itoa(c.Process.Pid)+"\n"), 0o644)
	}
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err = p.ping(pctx)
		cancel()
		if err == nil {
			p.lastBoot = time.Since(started)
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("prove: temp %s on port %d %w: %s", p.kind, p.port, errExitedAtStart, tail(p.log(), 600))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			p.kill()
			return fmt.Errorf("prove: temp %s on port %d not ready within %s: %w: %s", p.kind, p.port, limit, err, tail(p.log(), 600))
		}
		sleepCtx(ctx, 50*time.Millisecond)
	}
}

// ping opens a connection to the server and closes it.
func (p *tempServer) ping(ctx context.Context) error {
	if p.kind == serverRabbitMQ {
		return p.pingRabbit(ctx)
	}
	var db *sql.DB
	var err error
	if p.kind == serverMariaDB {
		db, err = ferrymysql.Open(p.URL()) // connects at once
	} else {
		db, err = sql.Open("pgx", p.URL())
	}
	if err != nil {
		return err
	}
	defer db.Close()
	return db.PingContext(ctx)
}

// crash SIGKILLs the postmaster and every one of its children (the
// backends, checkpointer, WAL writer…) and waits until all are gone: no
// shutdown checkpoint, no goodbye to clients, no backend left to notice
// the postmaster's death and answer its client; whatever was not in the
// WAL on disk is lost, as in a power cut of the server's processes.
func (p *tempServer) crash() error {
	if p.cmd == nil || p.cmd.Process == nil {
		return fmt.Errorf("prove: temp %s is not running", p.kind)
	}
	p.kill()
	return nil
}

// freeze SIGSTOPs the postmaster and every child: each statement in
// flight hangs, its answer unsent.
func (p *tempServer) freeze() {
	if p.cmd != nil && p.cmd.Process != nil {
		p.stopAll()
	}
}

// thaw SIGCONTs the postmaster and its children after a freeze.
func (p *tempServer) thaw() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	pm := p.cmd.Process.Pid
	for _, pid := range append(descendants(pm), pm) {
		_ = syscall.Kill(pid, syscall.SIGCONT)
	}
}

// stopAll SIGSTOPs the postmaster (so it forks no more), then each of its
// descendants, and returns them all. They must be found by parent: every
// Postgres child calls setsid(), so none is in the postmaster's process
// group; so do beam.smp's erl_child_setup and inet_gethost.
func (p *tempServer) stopAll() []int {
	pm := p.cmd.Process.Pid
	_ = syscall.Kill(pm, syscall.SIGSTOP)
	waitStopped(pm)
	pids := append(descendants(pm), pm)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	return pids
}

// descendants lists pid's children, their children and so on, stopping
// each generation, and waiting until it is stopped, before reading the
// next (a stopped process forks no more).
func descendants(pid int) []int {
	var out []int
	gen := []int{pid}
	for len(gen) > 0 && len(out) < 10000 {
		var next []int
		for _, q := range gen {
			for _, c := range childPids(q) {
				_ = syscall.Kill(c, syscall.SIGSTOP)
				next = append(next, c)
			}
		}
		for _, c := range next {
			waitStopped(c)
		}
		out, gen = append(out, next...), next
	}
	return out
}

// waitStopped waits (at most a second) until pid is stopped or gone. A
// SIGSTOP takes effect only when the process next returns to user mode:
// a postmaster signalled inside fork() completes it first, and a scan of
// its children made before then misses the new one. That child (a
// backend not yet past its start) lived on unkilled, attached to the
// shared memory, so the restart on the same data directory refused to
// start ("pre-existing shared memory block … is still in use"; the
// project's CI at 574afdd, control-dual-write-db-crash).
func waitStopped(pid int) {
	for i := 0; i < 1000; i++ {
		switch procState(pid) {
		case 0, 'T', 't', 'Z', 'X':
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// procState is the state letter of pid in /proc (R, S, D, T, Z…), 0 if
// it is gone.
func procState(pid int) byte {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0
	}
	return s[i+2]
}

// killWait bounds how long kill waits for the killed processes to be
// gone. A SIGKILLed process in uninterruptible sleep (an fsync on a busy
// disk) dies only when the I/O returns, and until then it holds the
// Postgres shared memory segment.
const killWait = 60 * time.Second

// kill stops the postmaster and its children, SIGKILLs them all (none
// runs in between) and waits, within killWait, until every one is gone
// and (Postgres) no process is attached to the cluster's shared memory
// segment any more: the condition a restart on the same data directory
// checks. Any process still working in the data directory (every
// Postgres and MariaDB server process runs there) is SIGKILLed as well,
// whoever its parent, so that one that escaped the scan by parent cannot
// keep the restart waiting.
func (p *tempServer) kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	shmid, hasShm := 0, false
	if p.kind == serverPostgres {
		shmid, hasShm = pgShmID(filepath.Join(p.data, "postmaster.pid"))
	}
	pids := p.stopAll()
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(killWait)
	select {
	case <-p.exited:
	case <-time.After(killWait):
	}
	// The children are reparented and reaped by init once the postmaster
	// is gone.
	for time.Now().Before(deadline) {
		left := 0
		for _, pid := range pids {
			if processAlive(pid) {
				left++
			}
		}
		if p.kind != serverRabbitMQ {
			for _, pid := range processesIn(p.data) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
				left++
			}
		}
		if left == 0 && (!hasShm || shmAttached(shmid) == 0) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.cmd = nil
}

// processesIn lists the live processes whose working directory is dir.
func processesIn(dir string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil || n == os.Getpid() {
			continue
		}
		if cwd, err := os.Readlink("/proc/" + e.Name() + "/cwd"); err == nil && cwd == dir && processAlive(n) {
			out = append(out, n)
		}
	}
	return out
}

// pgShmID reads the SysV shared memory id a postmaster recorded in its
// postmaster.pid (line 7: key and id).
func pgShmID(pidFile string) (int, bool) {
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return 0, false
	}
	lines := strings.Split(string(b), "\n")
	if len(lines) < 7 {
		return 0, false
	}
	f := strings.Fields(lines[6])
	if len(f) != 2 {
		return 0, false
	}
	id, err := strconv.Atoi(f[1])
	return id, err == nil
}

// shmAttached is the number of processes attached to SysV shared memory
// segment id (/proc/sysvipc/shm), 0 when the segment is gone: the figure
// a starting postmaster checks before it takes over a crashed cluster's
// data directory.
func shmAttached(id int) int {
	b, err := os.ReadFile("/proc/sysvipc/shm")
	if err != nil {
		return 0
	}
	want := strconv.Itoa(id)
	for _, line := range strings.Split(string(b), "\n")[1:] {
		// key shmid perms size cpid lpid nattch …
		f := strings.Fields(line)
		if len(f) > 6 && f[1] == want {
			n, _ := strconv.Atoi(f[6])
			return n
		}
	}
	return 0
}

// childPids lists the processes whose parent is pid (Linux /proc).
func childPids(pid int) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: the fields follow the last ')'.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[1] == strconv.Itoa(pid) {
			out = append(out, n)
		}
	}
	return out
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	switch procState(pid) {
	case 0, 'Z', 'X':
		return false
	}
	return true
}

// close kills the server (and a RabbitMQ node's epmd) and removes its
// directory and lock.
func (p *tempServer) close() {
	p.kill()
	p.stopEpmd()
	if p.dir != "" {
		_ = os.RemoveAll(p.dir)
	}
	if p.lock != nil {
		_ = p.lock.Close()
	}
}

func (p *tempServer) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// sweepTempServers removes throwaway clusters whose owner died (its lock
// is free): a server still running there (a parent-death signal can miss,
// e.g. when the owner's thread had already exited) is SIGKILLed by the pid
// in postmaster.pid, after checking /proc that the pid is a postgres on
// that data directory; then the directory goes. Clusters whose owner
// lives are left alone, so concurrent runs do not disturb each other.
//
// Throwaway RabbitMQ nodes the same: the node (its command line names its
// directory, its HOME) and its epmd (whose working directory is it), by the
// pids prove wrote there.
func sweepTempServers() {
	ownerdir.Sweep(filepath.Join(os.TempDir(), tempPGPrefix+"*"), func(dir string) {
		killStale(filepath.Join(dir, "data"), filepath.Join(dir, "data", "postmaster.pid"))
		killStale(filepath.Join(dir, "data"), filepath.Join(dir, "mariadbd.pid"))
	})
	ownerdir.Sweep(filepath.Join(os.TempDir(), tempRabbitPrefix+"*"), func(dir string) {
		killStale(dir, filepath.Join(dir, "server.pid"))
		killStale(dir, filepath.Join(dir, "epmd.pid"))
	})
}

// killStale SIGKILLs the server whose pid pidFile names (and its
// descendants), if /proc says it still runs on data: its command line
// names data, or data is its working directory; and then any process
// still working in data.
func killStale(data, pidFile string) {
	defer func() {
		// Orphans: children of a server killed earlier that were
		// reparented away (no longer found by parent) but still work in
		// its directory.
		for _, k := range processesIn(data) {
			_ = syscall.Kill(k, syscall.SIGKILL)
		}
	}()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		return
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 1 {
		return
	}
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return // gone
	}
	if cwd, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/cwd"); !strings.Contains(string(cmdline), data) && cwd != data {
		return // the pid was reused by something else
	}
	_ = syscall.Kill(pid, syscall.SIGSTOP)
	waitStopped(pid)
	kids := descendants(pid)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	for _, k := range kids {
		_ = syscall.Kill(k, syscall.SIGKILL)
	}
	for i := 0; i < 200 && processAlive(pid); i++ {
		time.Sleep(25 * time.Millisecond)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("prove: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
