package prove

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/ferryhq/ferry/internal/testenv"
)

// TestSoakShortRun runs a 20 s soak at small scale with a row every 5 s
// and a fault every 2 s: the rows are there, every fault kind fired, every
// process was sampled at both ends, and the checker passed.
func TestSoakShortRun(t *testing.T) {
	parallelUnlessRace(t)
	if testing.Short() {
		t.Skip("soak: 20 s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := RunSoak(ctx, SoakOptions{Period: 20 * time.Second, Interval: 5 * time.Second, FaultEvery: 2 * time.Second, Rate: 10}, small()...)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	t.Log(buf.String())
	if rep.Result.Status != StatusPass || rep.Failed() {
		t.Fatalf("soak checker: status %s, violations %v, note %q", rep.Result.Status, rep.Result.Violations, rep.Result.Note)
	}
	producing := 0
	for _, r := range rep.Rows {
		if r.Phase == "producing" {
			producing++
		}
	}
	if producing < 4 {
		t.Errorf("%d producing rows over 20 s at 5 s intervals, want at least 4: %+v", producing, rep.Rows)
	}
	last := rep.Rows[len(rep.Rows)-1]
	if f := rep.Result.Figures; last.CommittedTotal != f.Committed || last.AppliedTotal != f.Committed || f.Committed < 100 {
		t.Errorf("last row committed %d applied %d; checker committed %d (want ≥100 at 10 tx/s for 20 s, all applied)", last.CommittedTotal, last.AppliedTotal, f.Committed)
	}
	kinds := map[string]int{}
	for _, f := range rep.Faults {
		kinds[f.Kind]++
	}
	for _, k := range []string{soakRelayKill, soakInboxKill, soakRelayPause, soakOutage} {
		if k == soakRelayPause && !canStop {
			continue
		}
		if kinds[k] == 0 {
			t.Errorf("fault %s never fired: %+v", k, rep.Faults)
		}
	}
	if len(rep.Processes) != 4 {
		t.Fatalf("%d processes, want prove + relay-a + relay-b + inbox: %+v", len(rep.Processes), rep.Processes)
	}
	for _, p := range rep.Processes {
		for _, s := range []ProcSample{p.Start, p.End} {
			if s.PID == 0 || s.Goroutines == 0 || s.HeapKiB == 0 || (runtime.GOOS == "linux" && s.RSSKiB == 0) {
				t.Errorf("%s: sample %+v lacks pid, goroutines or RSS", p.Name, s)
			}
		}
	}
	for _, want := range []string{"INTERVAL", "LAG P99", "PROCESS", "relay-b", "checker:"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("table lacks %q", want)
		}
	}
}

// TestSoakGrowthFindings: growth between the samples of one process is a
// finding; a restarted worker's is not; no growth, no finding.
func TestSoakGrowthFindings(t *testing.T) {
	ps := []SoakProcess{
		{Name: "prove", Start: ProcSample{PID: 1, RSSKiB: 100_000, Goroutines: 50}, End: ProcSample{PID: 1, RSSKiB: 100_500, Goroutines: 52}},
		{Name: "relay-a", Start: ProcSample{PID: 2, RSSKiB: 20_000, Goroutines: 20}, End: ProcSample{PID: 2, RSSKiB: 45_000, Goroutines: 90}},
		{Name: "relay-b", Start: ProcSample{PID: 3, RSSKiB: 20_000, Goroutines: 20}, End: ProcSample{PID: 4, RSSKiB: 90_000, Goroutines: 90}},
	}
	got := growthFindings(ps)
	if len(got) != 2 || !strings.Contains(got[0], "relay-a") || !strings.Contains(got[0], "resident memory") || !strings.Contains(got[1], "goroutines grew from 20 to 90") {
		t.Fatalf("findings %q: want relay-a's RSS and goroutine growth only", got)
	}
}

func TestSoakOptionsRejected(t *testing.T) {
	for _, so := range []SoakOptions{
		{Period: time.Second},
		{Period: time.Minute, Interval: 2 * time.Minute},
		{Period: time.Minute, FaultEvery: time.Millisecond},
		{Period: time.Minute, Rate: -1},
	} {
		_, err := RunSoak(context.Background(), so, small()...)
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: err %v, want ErrInvalidConfig", so, err)
		}
	}
}

// runBrokerSoak runs a 30 s soak (10 tx/s, a fault every 2 s, a row every
// 10 s) on the stack opts select and checks what every soak must show:
// the checker passed (0 lost, phantom, duplicate applies and effects,
// order violations), each of want fired at least once and never failed,
// and every fault is counted in some row and in FaultsByKind.
func runBrokerSoak(t *testing.T, want []string, opts ...Option) *SoakReport {
	t.Helper()
	if testing.Short() {
		t.Skip("soak: 30 s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := RunSoak(ctx, SoakOptions{Period: 30 * time.Second, Interval: 10 * time.Second, FaultEvery: 2 * time.Second, Rate: 10}, small(opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := rep.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	t.Log(buf.String())
	f := rep.Result.Figures
	if rep.Failed() || f.Lost != 0 || f.Phantom != 0 || f.DuplicateApplies != 0 || f.DuplicateEffects != 0 || f.OrderViolations != 0 || f.Committed < 100 {
		t.Fatalf("soak checker: status %s, violations %v, note %q, figures %+v", rep.Result.Status, rep.Result.Violations, rep.Result.Note, f)
	}
	inRows := 0
	for _, r := range rep.Rows {
		inRows += len(r.Faults)
	}
	if inRows != len(rep.Faults) {
		t.Errorf("%d faults in the rows, %d fired", inRows, len(rep.Faults))
	}
	kinds := map[string]int{}
	for _, fl := range rep.Faults {
		kinds[fl.Kind]++
		if strings.HasPrefix(fl.Note, "failed") {
			t.Errorf("fault %s at %s: %s", fl.Kind, fl.At, fl.Note)
		}
	}
	for _, k := range want {
		if kinds[k] == 0 || rep.FaultsByKind[k] != kinds[k] {
			t.Errorf("fault %s fired %d times (by kind: %d), want at least once: %+v", k, kinds[k], rep.FaultsByKind[k], rep.Faults)
		}
	}
	if !strings.Contains(buf.String(), want[len(want)-1]+" ") {
		t.Errorf("table does not count %s", want[len(want)-1])
	}
	return rep
}

// TestSoakKfakeBrokerFaults: on kfake the rotation includes the Kafka
// scenarios' faults — partition leaders moved, a broker taken away and
// added back — next to the process faults and the outage.
func TestSoakKfakeBrokerFaults(t *testing.T) {
	parallelUnlessRace(t)
	rep := runBrokerSoak(t, []string{soakRelayKill, soakInboxKill, soakOutage, kafkaLeaderMove, kafkaBrokerDown}, WithBroker("kafka://kfake"))
	for _, fl := range rep.Faults {
		if fl.Kind == kafkaLeaderMove && !strings.Contains(fl.Note, "partition leader moves") ||
			fl.Kind == kafkaBrokerDown && !strings.Contains(fl.Note, "added back") {
			t.Errorf("%s: note %q", fl.Kind, fl.Note)
		}
	}
}

// TestSoakNATSClusterFaults: on prove's NATS cluster the rotation has the
// leader kill and the partition.
func TestSoakNATSClusterFaults(t *testing.T) {
	parallelUnlessRace(t) // its cluster's directory is held by ownerdir; no test here counts them then
	runBrokerSoak(t, []string{soakRelayKill, soakInboxKill, soakClusterKill, soakClusterCut}, WithBroker(BrokerNATSCluster))
}

// TestSoakRabbitMQBrokerFaults: on RabbitMQ the rotation has the relay's
// connection dropped and its channel closed; the channel fault waits for
// a relay subprocess to report the closed channel (through its status
// file), so it firing without "failed" shows that report arrives.
func TestSoakRabbitMQBrokerFaults(t *testing.T) {
	parallelUnlessRace(t)
	rep := runBrokerSoak(t, []string{soakRelayKill, soakInboxKill, soakOutage, rabbitConnDrop, rabbitChannelClose}, WithBroker(testenv.RabbitMQURL(t)))
	for _, fl := range rep.Faults {
		if fl.Kind == rabbitChannelClose && !strings.Contains(fl.Note, "held as destination missing") {
			t.Errorf("%s: note %q", fl.Kind, fl.Note)
		}
	}
}
