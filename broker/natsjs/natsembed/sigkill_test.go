package natsembed

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestClusterAfterSIGKILL: a process running a cluster is SIGKILLed (no
// Close: its store directory stays behind); the next StartCluster removes
// that directory — its owner's lock died with it — and starts normally,
// while a directory whose owner is alive is left alone.
func TestClusterAfterSIGKILL(t *testing.T) {
	if os.Getenv("NATSEMBED_SIGKILL_CHILD") == "1" {
		c, err := StartCluster(3, "k", nil)
		if err != nil {
			os.Exit(2)
		}
		os.Stdout.WriteString("DIR " + c.dir + "\n")
		time.Sleep(time.Minute) // killed long before
		os.Exit(0)
	}
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)

	// A live owner's directory (this process holds its lock).
	live, err := StartCluster(3, "live", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer live.Close()

	cmd := exec.Command(os.Args[0], "-test.run=^TestClusterAfterSIGKILL$")
	cmd.Env = append(os.Environ(), "NATSEMBED_SIGKILL_CHILD=1", "TMPDIR="+tmp)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var dead string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "DIR "); ok {
			dead = d
			break
		}
	}
	if dead == "" {
		_ = cmd.Process.Kill()
		t.Fatal("child did not start its cluster")
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if _, err := os.Stat(filepath.Join(dead, "node-0")); err != nil {
		t.Fatalf("the killed run's directory is not there to sweep: %v", err)
	}

	c, err := StartCluster(3, "next", nil)
	if err != nil {
		t.Fatalf("start after a SIGKILLed run: %v", err)
	}
	defer c.Close()
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("the SIGKILLed run's directory %s is still there: %v", dead, err)
	}
	if _, err := os.Stat(live.dir); err != nil {
		t.Errorf("the live run's directory was swept: %v", err)
	}
}
