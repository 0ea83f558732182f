package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/testenv"
)

// bench consume --recovery end to end on a short run: for embedded NATS
// and kfake it SIGKILLs a consumer subprocess mid-stream, restarts it and
// reports restart → first delivery and restart → drained; every event is
// applied exactly once (applied = distinct = events).
func TestBenchConsumeRecovery(t *testing.T) {
	s := testenv.NewPostgresSchema(t)
	t.Setenv(childEnv, "1")
	const events = 300
	out, err := runCLI(t, "bench", "consume", "--recovery", "--brokers", "nats-embedded,kafka", "--rounds", "1",
		"--events", "300", "--aggregates", "30", "--workers", "2", "--nats-ack-wait", "1s", "--kafka-session-timeout", "6s",
		"--json", "--database-url", s.URL)
	if err != nil {
		t.Fatalf("bench: %v\n%s", err, out)
	}
	var rep recoveryReport
	if err := json.Unmarshal([]byte(out[strings.Index(out, "{"):]), &rep); err != nil {
		t.Fatalf("not a report: %v\n%s", err, out)
	}
	if len(rep.Summary) != 2 || len(rep.Rounds) != 2 {
		t.Fatalf("want 2 brokers × 1 round, got %d summaries, %d rounds:\n%s", len(rep.Summary), len(rep.Rounds), out)
	}
	for _, sum := range rep.Summary {
		if sum.Error != "" || sum.Rounds != 1 || sum.FirstDelivery <= 0 || sum.Drain < sum.FirstDelivery || sum.Settings == "" {
			t.Errorf("summary %+v", sum)
		}
	}
	for _, r := range rep.Rounds {
		if r.AppliedAtKill <= 0 || r.AppliedAtKill >= events || r.DistinctEvents != events || r.Applied != events || r.ApplyRate <= 0 {
			t.Errorf("round %+v: want a kill mid-stream and every event applied once", r)
		}
		// The killed JetStream consumer held pulled, unacked messages:
		// they come back marked as redelivered.
		if r.Broker == "nats-embedded" && r.FirstRedelivery <= 0 {
			t.Errorf("nats round %+v: no redelivery of the killed consumer's messages", r)
		}
	}
}
