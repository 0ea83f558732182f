package effect_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry/effect"
)

// TestSlowStartIsNotAnAttempt: a start (pending → in_flight) that the
// database holds past the point where the lease would still cover a call
// is not followed by a call — and, nothing having been sent, it is taken
// back instead of counting as an attempt. A trigger delays the first two
// starts by 1.2 s, past (lease 2 s − call timeout 200 ms)/2 = 0.9 s, with
// one attempt allowed: the intent must still be charged once and succeed
// with attempts 1, without a status query. Without the take-back the first
// slow start used up the only attempt: the row was reconciled after its
// lease ("not found") and failed with no call made.
func TestSlowStartIsNotAnAttempt(t *testing.T) {
	t.Run("postgres", func(t *testing.T) {
		slowStart(t, pgHarness(t), []string{
			`CREATE TABLE slow_starts (n integer NOT NULL)`,
			`INSERT INTO slow_starts VALUES (2)`,
			`CREATE FUNCTION slow_start() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF OLD.state = 'pending' AND NEW.state = 'in_flight' THEN
    UPDATE slow_starts SET n = n - 1 WHERE n > 0;
    IF FOUND THEN PERFORM pg_sleep(1.2); END IF;
  END IF;
  RETURN NEW;
END $$`,
			`CREATE TRIGGER slow_start BEFORE UPDATE ON ferry_effects FOR EACH ROW EXECUTE FUNCTION slow_start()`,
		})
	})
	t.Run("mysql", func(t *testing.T) {
		slowStart(t, mysqlHarness(t), []string{
			`CREATE TABLE slow_starts (n integer NOT NULL)`,
			`INSERT INTO slow_starts VALUES (2)`,
			`CREATE TRIGGER slow_start BEFORE UPDATE ON ferry_effects FOR EACH ROW
BEGIN
  IF OLD.state = 'pending' AND NEW.state = 'in_flight' AND (SELECT n FROM slow_starts) > 0 THEN
    UPDATE slow_starts SET n = n - 1;
    DO SLEEP(1.2);
  END IF;
END`,
		})
	})
}

func slowStart[TTx any](t *testing.T, h *harness[TTx], ddl []string) {
	ctx := context.Background()
	for _, q := range ddl {
		if _, err := h.drv.Executor().Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	p := newProvider(t, modeNormal)
	orders := h.placeOrders(t, 1)
	c := httpClient(t, p)
	reg := prometheus.NewRegistry()
	w, err := effect.NewWorker(h.ledger, c, c, append(fastOpts(), effect.WithRegisterer(reg),
		effect.WithLease(2*time.Second), effect.WithCallTimeout(200*time.Millisecond), effect.WithMaxAttempts(1))...)
	if err != nil {
		t.Fatal(err)
	}
	st := runUntilSettled(t, h, w, 30*time.Second)
	recs, err := h.ledger.ByEvent(ctx, orders[0].EventID)
	if err != nil || len(recs) != 1 {
		t.Fatalf("ledger rows of the event: %v, %v", recs, err)
	}
	r := recs[0]
	if st.ByState[effect.StateSucceeded] != 1 || r.State != effect.StateSucceeded || r.Attempts != 1 {
		t.Fatalf("ledger %v; row state %s, attempts %d, last error %q: want succeeded after 1 attempt", st.ByState, r.State, r.Attempts, r.LastError)
	}
	if posts, q := p.postsFor(orders[0].Key), p.statusQueries(); posts != 1 || q != 0 {
		t.Fatalf("provider saw %d charge requests and %d status queries, want 1 and 0", posts, q)
	}
	checkExactlyOnce(t, p, orders)
	notCalled := sumMetric(t, reg, "ferry_effect_attempts_total", "outcome", "not_called")
	if notCalled != 2 {
		t.Errorf("ferry_effect_attempts_total{outcome=not_called} = %v, want 2 (the two delayed starts)", notCalled)
	}
}
