package inbox

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"github.com/ferryhq/ferry/driver"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker"
)

func TestDuplicateDeliveredFiveTimes(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			ib := newInbox(t, s, nil)
			ev := event(t, "acme", "o1", 1, `{"n":1}`)
			for i := range 5 {
				acked, _, err := deliver(t, ib, ev)
				if err != nil || !acked {
					t.Fatalf("delivery %d: acked=%v err=%v", i, acked, err)
				}
			}
			if n := len(effects(t, s.db)); n != 1 {
				t.Fatalf("effects = %d, want 1", n)
			}
			if n := s.count(t, `SELECT count(*) FROM ferry_inbox`); n != 1 {
				t.Fatalf("inbox rows = %d, want 1", n)
			}
			if st := ib.Stats(); st.Applied != 1 || st.Duplicates != 4 {
				t.Fatalf("stats = %+v, want applied 1 duplicates 4", st)
			}
		})
	}
}

// Two consumer instances (two Inbox values, as two processes would have)
// receive the same event five times, concurrently.
func TestDuplicatesConcurrentTwoInstances(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			a, b := newInbox(t, s, nil), newInbox(t, s, nil)
			for round := range 10 {
				ev := event(t, "acme", fmt.Sprintf("o%d", round), 1, `{}`)
				var wg sync.WaitGroup
				acks := make(chan bool, 5)
				for i := range 5 {
					ib := a
					if i%2 == 1 {
						ib = b
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						// A lost race is nacked for an immediate retry, as
						// the broker would redeliver it.
						for attempt := 0; attempt < 20; attempt++ {
							acked, _, err := deliver(t, ib, ev)
							if err != nil {
								t.Error(err)
								return
							}
							if acked {
								acks <- true
								return
							}
						}
						t.Error("never acked")
					}()
				}
				wg.Wait()
				close(acks)
				if len(acks) != 5 {
					t.Fatalf("round %d: %d acks, want 5", round, len(acks))
				}
				if n := s.count(t, `SELECT count(*) FROM effects WHERE event_id = $1`, ev.ID.String()); n != 1 {
					t.Fatalf("round %d: effects = %d, want 1", round, n)
				}
				if n := s.count(t, `SELECT count(*) FROM ferry_inbox WHERE event_id = $1`, ev.ID.String()); n != 1 {
					t.Fatalf("round %d: inbox rows = %d, want 1", round, n)
				}
			}
			sa, sb := a.Stats(), b.Stats()
			if sa.Applied+sb.Applied != 10 || sa.Duplicates+sb.Duplicates != 40 {
				t.Fatalf("stats a=%+v b=%+v: want 10 applied and 40 duplicates in total", sa, sb)
			}
		})
	}
}

func TestOrderGapParkedThenApplied(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			ib := newInbox(t, s, nil)
			e1, e2, e3 := event(t, "acme", "o1", 1, "a"), event(t, "acme", "o1", 2, "b"), event(t, "acme", "o1", 3, "c")
			mustDeliver(t, ib, e1)
			mustDeliver(t, ib, e3)
			gaps := openParked(t, ib, ReasonGap)
			if len(gaps) != 1 || gaps[0].Event.ID != e3.ID || gaps[0].Event.AggregateSeq != 3 {
				t.Fatalf("after 1,3: parked gaps = %+v, want event 3", gaps)
			}
			if got := seqs(effects(t, s.db)); got != "1" {
				t.Fatalf("after 1,3: effects %s, want 1", got)
			}
			// 3 redelivered while still waiting: still one parked row.
			mustDeliver(t, ib, e3)
			if gaps := openParked(t, ib, ReasonGap); len(gaps) != 1 || gaps[0].Attempts != 2 {
				t.Fatalf("redelivered gap: %+v, want one row with 2 attempts", gaps)
			}
			mustDeliver(t, ib, e2)
			if got := seqs(effects(t, s.db)); got != "1,2,3" {
				t.Fatalf("effects %s, want 1,2,3", got)
			}
			if gaps := openParked(t, ib, ReasonGap); len(gaps) != 0 {
				t.Fatalf("open gaps after fill: %+v", gaps)
			}
			p, err := ib.GetParked(context.Background(), gaps[0].ID)
			if err != nil || p.ResolvedAt == nil || p.Resolution != "applied" {
				t.Fatalf("parked row after fill: %+v %v", p, err)
			}
			if st := ib.Stats(); st.Applied != 3 {
				t.Fatalf("applied = %d, want 3", st.Applied)
			}
			// A later, different event with an old sequence is stale.
			old := event(t, "acme", "o1", 2, "late")
			mustDeliver(t, ib, old)
			if st := ib.Stats(); st.Stale != 1 || len(effects(t, s.db)) != 3 {
				t.Fatalf("stale: stats %+v effects %d", st, len(effects(t, s.db)))
			}
		})
	}
}

// A parked successor whose replay fails with an error that aborts the
// whole transaction (a MySQL deadlock: InnoDB rolls the transaction back,
// savepoints included) fails the predecessor's delivery too, which is then
// retried: swallowing it acked the predecessor with its effect rolled back
// and left the successor parked for ever (found by the chaos test on
// MySQL). The hook aborts the transaction the way the deadlock does.
func TestSuccessorAbortingTransactionRetriesPredecessor(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			ib := newInbox(t, s, nil)
			e1, e2, e3 := event(t, "acme", "o1", 1, "a"), event(t, "acme", "o1", 2, "b"), event(t, "acme", "o1", 3, "c")
			mustDeliver(t, ib, e1)
			mustDeliver(t, ib, e3)
			var fired atomic.Bool
			ib.cfg.beforeResolveParked = func(ctx context.Context, tx driver.Tx) error {
				if fired.Swap(true) {
					return nil
				}
				if _, err := tx.Exec(ctx, "ROLLBACK"); err != nil {
					return err
				}
				return errors.New("deadlock found when trying to get lock (injected)")
			}
			acked, _, _ := deliver(t, ib, e2)
			if !fired.Load() {
				t.Fatal("the successor's replay never reached the hook")
			}
			if acked {
				t.Fatalf("the predecessor was acked although its transaction was aborted (effects %s)", seqs(effects(t, s.db)))
			}
			if got := seqs(effects(t, s.db)); got != "1" {
				t.Fatalf("after the aborted transaction: effects %s, want 1", got)
			}
			mustDeliver(t, ib, e2) // the broker's redelivery
			if got := seqs(effects(t, s.db)); got != "1,2,3" {
				t.Fatalf("after the redelivery: effects %s, want 1,2,3", got)
			}
			if gaps := openParked(t, ib, ReasonGap); len(gaps) != 0 {
				t.Fatalf("open gaps after the redelivery: %+v", gaps)
			}
		})
	}
}

func TestStrictStartParksLateFirstEvent(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			strict := newInbox(t, s, nil)
			mustDeliver(t, strict, event(t, "acme", "late", 7, "x"))
			if len(openParked(t, strict, ReasonGap)) != 1 || len(effects(t, s.db)) != 0 {
				t.Fatal("strict start: first event with seq 7 must be parked as a gap")
			}
			any := newInbox(t, s, nil, WithStartPolicy(StartAtFirstSeen))
			mustDeliver(t, any, event(t, "acme", "late2", 7, "x"))
			mustDeliver(t, any, event(t, "acme", "late2", 8, "y"))
			if got := seqs(effects(t, s.db)); got != "7,8" {
				t.Fatalf("start at first seen: effects %s, want 7,8", got)
			}
		})
	}
}

func TestWithoutOrderingOnlyDedups(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			ib := newInbox(t, s, nil, WithoutOrdering())
			e1, e3 := event(t, "acme", "o1", 1, "a"), event(t, "acme", "o1", 3, "c")
			mustDeliver(t, ib, e3)
			mustDeliver(t, ib, e1)
			mustDeliver(t, ib, e3)
			if got := seqs(effects(t, s.db)); got != "3,1" {
				t.Fatalf("effects %s, want 3,1", got)
			}
			if n := s.count(t, `SELECT count(*) FROM ferry_inbox_cursor`); n != 0 {
				t.Fatalf("cursor rows = %d, want none without ordering", n)
			}
			// The same in one batch (the bulk claim path on Postgres).
			batched := newInbox(t, s, nil, WithoutOrdering(), WithBatch(8, 0))
			b3, b1 := event(t, "acme", "o2", 3, "c"), event(t, "acme", "o2", 1, "a")
			rec := &settled{}
			if err := batched.process(context.Background(), []*message{newMessage(delivery(b3, 1, rec)),
				newMessage(delivery(b1, 1, rec)), newMessage(delivery(b3, 1, rec))}); err != nil {
				t.Fatal(err)
			}
			if st := batched.Stats(); st.Applied != 2 || st.Duplicates != 1 || rec.acks != 3 {
				t.Fatalf("batched without ordering: stats %+v acks %d", st, rec.acks)
			}
			if n := s.count(t, `SELECT count(*) FROM ferry_inbox_cursor`); n != 0 {
				t.Fatalf("cursor rows = %d, want none without ordering", n)
			}
		})
	}
}

func TestCollisionParkedOriginalUntouched(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			ib := newInbox(t, s, nil)
			orig := event(t, "acme", "o1", 1, `{"amount":10}`)
			mustDeliver(t, ib, orig)
			forged := orig
			forged.Payload = []byte(`{"amount":1000}`)
			mustDeliver(t, ib, forged)
			es := effects(t, s.db)
			if len(es) != 1 || es[0].payload != `{"amount":10}` {
				t.Fatalf("effects %+v, want the original only", es)
			}
			ps := openParked(t, ib, ReasonCollision)
			if len(ps) != 1 {
				t.Fatalf("collisions parked = %d, want 1", len(ps))
			}
			fpOrig, fpForged := Fingerprint(orig), Fingerprint(forged)
			if !bytes.Equal(ps[0].Fingerprint, fpForged[:]) || !bytes.Equal(ps[0].OtherFingerprint, fpOrig[:]) {
				t.Fatalf("parked fingerprints do not name both events")
			}
			if string(ps[0].Event.Payload) != `{"amount":1000}` {
				t.Fatalf("parked payload = %q", ps[0].Event.Payload)
			}
			if st := ib.Stats(); st.Collisions != 1 || st.Applied != 1 {
				t.Fatalf("stats %+v, want 1 collision, 1 applied", st)
			}
		})
	}
}

func TestSameEventIDTwoTenants(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			ib := newInbox(t, s, nil)
			a := event(t, "acme", "o1", 1, "a")
			b := a
			b.TenantID = "globex"
			mustDeliver(t, ib, a)
			mustDeliver(t, ib, b)
			es := effects(t, s.db)
			if len(es) != 2 || es[0].tenant != "acme" || es[1].tenant != "globex" {
				t.Fatalf("effects %+v, want one per tenant", es)
			}
		})
	}
}

func TestSchemaParkedThenReplayedAfterUpgrade(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			ctx := context.Background()
			v1 := newInbox(t, s, nil, WithSchemas(SchemaKey{"order.created", 1}))
			e1 := event(t, "acme", "o1", 1, "v1")
			e2 := event(t, "acme", "o1", 2, "v2")
			e2.SchemaVersion = 2
			e3 := event(t, "acme", "o1", 3, "v1 again")
			mustDeliver(t, v1, e1)
			mustDeliver(t, v1, e2)
			mustDeliver(t, v1, e3) // waits behind the parked 2
			ps := openParked(t, v1, ReasonSchema)
			if len(ps) != 1 || ps[0].Event.ID != e2.ID || !strings.Contains(ps[0].LastError, "schema version 2") {
				t.Fatalf("schema parked: %+v", ps)
			}
			if len(openParked(t, v1, ReasonGap)) != 1 {
				t.Fatal("event 3 must wait as a gap behind the schema-parked 2")
			}
			// Replaying on the old version parks it again (same row).
			rs, err := v1.Replay(ctx, ps[0].ID)
			if err != nil || rs[0].Outcome != OutcomeParked || rs[0].Reason != ReasonSchema {
				t.Fatalf("replay before upgrade: %+v %v", rs, err)
			}
			// The upgraded consumer supports v2: a dry run says applied and
			// writes nothing; the replay applies 2, then the parked 3.
			v2 := newInbox(t, s, nil, WithSchemas(SchemaKey{"order.created", 1}, SchemaKey{"order.created", 2}))
			dr, err := v2.DryRun(ctx, ps[0].ID)
			if err != nil || dr[0].Outcome != OutcomeApplied || len(effects(t, s.db)) != 1 {
				t.Fatalf("dry run: %+v %v effects=%d", dr, err, len(effects(t, s.db)))
			}
			rs, err = v2.Replay(ctx, ps[0].ID)
			if err != nil || rs[0].Err != nil || rs[0].Outcome != OutcomeApplied || rs[0].Successors != 1 {
				t.Fatalf("replay after upgrade: %+v %v", rs, err)
			}
			if got := seqs(effects(t, s.db)); got != "1,2,3" {
				t.Fatalf("effects %s, want 1,2,3", got)
			}
			rs, _ = v2.Replay(ctx, ps[0].ID)
			if !errors.Is(rs[0].Err, ErrNotParked) {
				t.Fatalf("second replay: %v, want ErrNotParked", rs[0].Err)
			}
			if len(effects(t, s.db)) != 3 {
				t.Fatal("second replay applied again")
			}
		})
	}
}

func TestUnauthorizedParkedThenReplayed(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			ctx := context.Background()
			if _, err := s.db.Exec(`CREATE TABLE members (tenant_id text, principal text)`); err != nil {
				t.Fatal(err)
			}
			// The hook reads current state in the consumer's transaction.
			authz := func(ctx context.Context, tx *sql.Tx, ev ferry.Event) error {
				var n int
				if _, err := driver.QueryRow(ctx, s.drv.UnwrapExecutor(tx), `SELECT count(*) FROM members WHERE tenant_id = $1 AND principal = $2`,
					[]any{ev.TenantID, ev.Headers.Principal}, &n); err != nil {
					return err
				}
				if n == 0 {
					return fmt.Errorf("principal %s is not a member of tenant %s", ev.Headers.Principal, ev.TenantID)
				}
				return nil
			}
			for _, batch := range []int{1, 4} {
				ib := newInbox(t, s, nil, WithAuthorizer[*sql.Tx](authz), WithBatch(batch, 0))
				ev := event(t, "acme", fmt.Sprintf("b%d", batch), 1, "x")
				mustDeliver(t, ib, ev)
				ps := openParked(t, ib, ReasonUnauthorized)
				if len(ps) != 1 || !strings.Contains(ps[0].LastError, "not a member") {
					t.Fatalf("batch %d: unauthorized parked: %+v", batch, ps)
				}
				if n := s.count(t, `SELECT count(*) FROM ferry_inbox WHERE event_id = $1`, ev.ID.String()); n != 0 {
					t.Fatalf("batch %d: the denied claim must be undone, inbox rows = %d", batch, n)
				}
				if _, err := s.db.Exec(`INSERT INTO members VALUES ('acme', 'user:7')`); err != nil {
					t.Fatal(err)
				}
				rs, err := ib.Replay(ctx, ps[0].ID, ps[0].ID)
				if err != nil || rs[0].Outcome != OutcomeApplied || !errors.Is(rs[1].Err, ErrNotParked) {
					t.Fatalf("batch %d: replay: %+v %v", batch, rs, err)
				}
				if n := s.count(t, `SELECT count(*) FROM effects WHERE event_id = $1`, ev.ID.String()); n != 1 {
					t.Fatalf("batch %d: effects = %d, want 1", batch, n)
				}
				if _, err := s.db.Exec(`DELETE FROM members`); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func TestHandlerErrorsRetryThenPoison(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			fail := map[string]error{}
			var mu sync.Mutex
			h := func(ctx context.Context, tx *sql.Tx, ev ferry.Event) error {
				if err := s.writeEffect(ctx, tx, ev); err != nil { // written, then rolled back
					return err
				}
				mu.Lock()
				defer mu.Unlock()
				return fail[ev.AggregateID]
			}
			ib := newInbox(t, s, h, WithMaxAttempts(3))
			// Transient: rolled back (effect, claim, cursor), nacked, applied later.
			mu.Lock()
			fail["t"] = errors.New("downstream busy")
			mu.Unlock()
			ev := event(t, "acme", "t", 1, "x")
			if acked, nacked, err := deliver(t, ib, ev); err != nil || acked || !nacked {
				t.Fatalf("transient: acked=%v nacked=%v err=%v", acked, nacked, err)
			}
			if len(effects(t, s.db)) != 0 || s.count(t, `SELECT count(*) FROM ferry_inbox`) != 0 || s.count(t, `SELECT count(*) FROM ferry_inbox_cursor`) != 0 {
				t.Fatal("a failed handler must leave no effect, claim or cursor")
			}
			mu.Lock()
			delete(fail, "t")
			mu.Unlock()
			mustDeliver(t, ib, ev)
			if len(effects(t, s.db)) != 1 {
				t.Fatal("retry did not apply")
			}
			// Permanent: parked as poison at once, acked.
			mu.Lock()
			fail["p"] = Permanent(errors.New("order total negative"))
			fail["m"] = errors.New("always fails")
			mu.Unlock()
			mustDeliver(t, ib, event(t, "acme", "p", 1, "x"))
			ps := openParked(t, ib, ReasonPoison)
			if len(ps) != 1 || !strings.Contains(ps[0].LastError, "order total negative") {
				t.Fatalf("permanent: poison parked = %+v", ps)
			}
			// Too many attempts: poison on the 3rd.
			m := event(t, "acme", "m", 1, "x")
			for i := 1; i <= 3; i++ {
				acked, nacked, err := deliver(t, ib, m)
				if err != nil || (i < 3 && !nacked) || (i == 3 && !acked) {
					t.Fatalf("attempt %d: acked=%v nacked=%v err=%v", i, acked, nacked, err)
				}
			}
			if ps := openParked(t, ib, ReasonPoison); len(ps) != 2 {
				t.Fatalf("poison parked = %d, want 2", len(ps))
			}
			if len(effects(t, s.db)) != 1 {
				t.Fatal("poison messages must leave no effect")
			}
			// After the fix, replaying the poison messages applies each once.
			mu.Lock()
			clear(fail)
			mu.Unlock()
			var ids []int64
			for _, p := range openParked(t, ib, ReasonPoison) {
				ids = append(ids, p.ID)
			}
			rs, err := ib.Replay(context.Background(), ids...)
			if err != nil || len(rs) != 2 || rs[0].Outcome != OutcomeApplied || rs[1].Outcome != OutcomeApplied {
				t.Fatalf("replay poison after fix: %+v %v", rs, err)
			}
			if len(effects(t, s.db)) != 3 {
				t.Fatalf("effects after replay = %d, want 3", len(effects(t, s.db)))
			}
		})
	}
}

func TestUndecodableParkedWithRaw(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			ib := newInbox(t, s, nil, WithMaxRawBytes(16))
			rec := &settled{}
			d := &broker.Delivery{DecodeErr: errors.New("missing ce-id"),
				Raw: broker.RawMessage{Destination: "order.events", Headers: map[string]string{"ce-type": "x\x00y"}, Body: []byte("not json at all, and long")},
				Ack: func(context.Context) error { rec.acks++; return nil }}
			// An event that decoded but carries a NUL byte would break the
			// inbox's own writes: it is parked too, never retried forever.
			bad := event(t, "acme", "o\x00", 1, "x")
			d2 := delivery(bad, 1, rec)
			if err := ib.process(context.Background(), []*message{newMessage(d), newMessage(d2)}); err != nil {
				t.Fatal(err)
			}
			if rec.acks != 2 {
				t.Fatalf("acks = %d, want 2", rec.acks)
			}
			ps := openParked(t, ib, ReasonUndecodable)
			if len(ps) != 2 {
				t.Fatalf("undecodable parked = %d, want 2", len(ps))
			}
			if string(ps[0].Raw.Body) != "not json at all," || !strings.Contains(ps[0].LastError, "missing ce-id") || !strings.Contains(ps[0].LastError, "cut") {
				t.Fatalf("raw kept: %+v", ps[0])
			}
			if rs, _ := ib.Replay(context.Background(), ps[0].ID); !errors.Is(rs[0].Err, ErrNotReplayable) {
				t.Fatalf("replay undecodable: %v", rs[0].Err)
			}
		})
	}
}

func TestReleaseGap(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			ctx := context.Background()
			ib := newInbox(t, s, nil)
			mustDeliver(t, ib, event(t, "acme", "o1", 1, "a"))
			mustDeliver(t, ib, event(t, "acme", "o1", 4, "d"))
			mustDeliver(t, ib, event(t, "acme", "o1", 5, "e"))
			gaps := openParked(t, ib, ReasonGap)
			if len(gaps) != 2 {
				t.Fatalf("gaps = %d", len(gaps))
			}
			if _, err := ib.ReleaseGap(ctx, 999999); !errors.Is(err, ErrNotFound) {
				t.Fatalf("unknown id: %v", err)
			}
			rr, err := ib.ReleaseGap(ctx, gaps[0].ID)
			if err != nil || rr.Outcome != OutcomeApplied || rr.SkippedFrom != 2 || rr.SkippedTo != 3 || rr.Successors != 1 {
				t.Fatalf("release: %+v %v", rr, err)
			}
			if got := seqs(effects(t, s.db)); got != "1,4,5" {
				t.Fatalf("effects %s", got)
			}
			mustDeliver(t, ib, event(t, "acme", "o1", 2, "b"))
			if st := ib.Stats(); st.Stale != 1 {
				t.Fatalf("late event after release: stats %+v, want stale 1", st)
			}
			ps := openParked(t, ib, "")
			if len(ps) != 0 {
				t.Fatalf("open parked left: %+v", ps)
			}
		})
	}
}

func TestBatchSavepointsIsolateFailures(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			h := func(ctx context.Context, tx *sql.Tx, ev ferry.Event) error {
				if err := s.writeEffect(ctx, tx, ev); err != nil {
					return err
				}
				if string(ev.Payload) == "bad" {
					return errors.New("transient")
				}
				if string(ev.Payload) == "worse" {
					// A failing statement aborts a Postgres transaction;
					// only the savepoint keeps the neighbours.
					_, err := tx.ExecContext(ctx, `INSERT INTO no_such_table VALUES (1)`)
					return Permanent(err)
				}
				return nil
			}
			ib := newInbox(t, s, h, WithBatch(8, 0))
			rec := &settled{}
			var msgs []*message
			for i := range 8 {
				p := "ok"
				switch i {
				case 2:
					p = "bad"
				case 5:
					p = "worse"
				}
				msgs = append(msgs, newMessage(delivery(event(t, "acme", fmt.Sprintf("o%d", i), 1, p), 1, rec)))
			}
			msgs = append(msgs, newMessage(delivery(msgs[0].ev, 1, rec))) // a duplicate in the same batch
			// An undecodable message first: parked without a savepoint of
			// its own, before the first savepoint is taken.
			undecodable := &broker.Delivery{DecodeErr: errors.New("garbage"), Raw: broker.RawMessage{Body: []byte("?")},
				Ack: func(context.Context) error { rec.mu.Lock(); rec.acks++; rec.mu.Unlock(); return nil }}
			msgs = append([]*message{newMessage(undecodable)}, msgs...)
			if err := ib.process(context.Background(), msgs); err != nil {
				t.Fatal(err)
			}
			acks, nacks := rec.counts()
			if acks != 9 || nacks != 1 {
				t.Fatalf("acks=%d nacks=%d, want 9 and 1", acks, nacks)
			}
			if n := len(effects(t, s.db)); n != 6 {
				t.Fatalf("effects = %d, want 6", n)
			}
			if st := ib.Stats(); st.Applied != 6 || st.Duplicates != 1 || st.Parked[ReasonPoison] != 1 || st.Retries != 1 || st.Parked[ReasonUndecodable] != 1 {
				t.Fatalf("stats %+v", st)
			}
		})
	}
}

// Crash after the consumer commit, before the ack: the broker redelivers;
// the inbox absorbs it. And the negative control: the same crash against an
// inbox that claims in one transaction and applies in another loses the
// effect — the check can fail.
func TestCrashAfterCommitBeforeAck(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			crash := errors.New("kill -9")
			faulty := newInbox(t, s, nil, WithFaults(Faults{AfterCommitBeforeAck: func(ferry.Event) error { return crash }}))
			ev := event(t, "acme", "o1", 1, "x")
			acked, _, err := deliver(t, faulty, ev)
			if !errors.Is(err, ErrFault) || acked {
				t.Fatalf("fault: acked=%v err=%v", acked, err)
			}
			restarted := newInbox(t, s, nil)
			mustDeliver(t, restarted, ev) // the redelivery
			if n := s.count(t, `SELECT count(*) FROM effects WHERE event_id = $1`, ev.ID.String()); n != 1 {
				t.Fatalf("effects = %d, want 1", n)
			}
			if restarted.Stats().Duplicates != 1 {
				t.Fatal("redelivery not counted as duplicate")
			}

			// Negative control.
			nonAtomic := newInbox(t, s, nil, WithFaults(Faults{AfterCommitBeforeAck: func(ferry.Event) error { return crash }}))
			nonAtomic.cfg.nonAtomicTest = true
			ev2 := event(t, "acme", "o2", 1, "y")
			if _, _, err := deliver(t, nonAtomic, ev2); !errors.Is(err, ErrFault) {
				t.Fatalf("control fault: %v", err)
			}
			mustDeliver(t, newInbox(t, s, nil), ev2)
			if n := s.count(t, `SELECT count(*) FROM effects WHERE event_id = $1`, ev2.ID.String()); n != 0 {
				t.Fatalf("negative control: effects = %d; the non-atomic inbox should have lost the effect (0)", n)
			}
		})
	}
}

func TestCrashBeforeCommit(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			crash := errors.New("kill -9")
			faulty := newInbox(t, s, nil, WithFaults(Faults{BeforeCommit: func(ferry.Event) error { return crash }}))
			ev := event(t, "acme", "o1", 1, "x")
			if acked, _, err := deliver(t, faulty, ev); !errors.Is(err, ErrFault) || acked {
				t.Fatalf("fault: acked=%v err=%v", acked, err)
			}
			if len(effects(t, s.db)) != 0 || s.count(t, `SELECT count(*) FROM ferry_inbox`) != 0 {
				t.Fatal("crash before commit left an effect or claim")
			}
			ib := newInbox(t, s, nil)
			mustDeliver(t, ib, ev)
			mustDeliver(t, ib, ev)
			if n := len(effects(t, s.db)); n != 1 {
				t.Fatalf("effects = %d, want 1", n)
			}
		})
	}
}

// Two instances apply the same batch concurrently (the bulk claim path on
// Postgres): the loser of each race falls back to the per-message path,
// and every effect happens once.
func TestBatchConcurrentTwoInstances(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			a := newInbox(t, s, nil, WithBatch(16, 0))
			b := newInbox(t, s, nil, WithBatch(16, 0))
			for round := range 5 {
				var evs []ferry.Event
				for i := range 10 {
					evs = append(evs, event(t, "acme", fmt.Sprintf("c%d-%d", round, i%3), int64(i/3+1), "x"))
				}
				var wg sync.WaitGroup
				for _, ib := range []*Inbox[*sql.Tx]{a, b, a} {
					wg.Add(1)
					go func() {
						defer wg.Done()
						pending := evs
						for attempt := 0; len(pending) > 0 && attempt < 50; attempt++ {
							rec := &settled{}
							var msgs []*message
							var ds []*broker.Delivery
							for _, ev := range pending {
								d := delivery(ev, attempt+1, rec)
								ds = append(ds, d)
								msgs = append(msgs, newMessage(d))
							}
							if err := ib.process(context.Background(), msgs); err != nil {
								t.Error(err)
								return
							}
							var again []ferry.Event
							for _, m := range msgs {
								if m.outcome == OutcomeRetry {
									again = append(again, m.ev)
								}
							}
							pending = again
						}
						if len(pending) > 0 {
							t.Errorf("%d messages never settled", len(pending))
						}
					}()
				}
				wg.Wait()
			}
			es := effects(t, s.db)
			seen := map[string]int{}
			for _, e := range es {
				seen[e.eventID]++
			}
			if len(es) != 50 || len(seen) != 50 {
				t.Fatalf("effects = %d for %d distinct events, want 50 and 50", len(es), len(seen))
			}
			// Parked gaps (an instance saw 2 before another applied 1) are
			// healed by HealGaps; none stays open once healed.
			if _, err := a.HealGaps(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// HealGaps applies a parked gap message whose predecessor was applied by
// another instance that did not see the park (the race the sweep covers).
func TestHealGaps(t *testing.T) {
	for _, s := range stores(t) {
		t.Run(s.name, func(t *testing.T) {
			ib := newInbox(t, s, nil)
			e2 := event(t, "acme", "h1", 2, "b")
			mustDeliver(t, ib, e2)
			if len(openParked(t, ib, ReasonGap)) != 1 {
				t.Fatal("2 not parked")
			}
			// The other instance applied 1 and committed its cursor.
			if _, err := s.drv.Executor().Exec(context.Background(), `INSERT INTO ferry_inbox_cursor (consumer, tenant_id, aggregate_type, aggregate_id, last_seq, updated_at)
				VALUES ('shipping', 'acme', 'order', 'h1', 1, $1)`, time.Now().UTC()); err != nil {
				t.Fatal(err)
			}
			n, err := ib.HealGaps(context.Background())
			if err != nil || n != 1 {
				t.Fatalf("heal: %d %v", n, err)
			}
			if got := seqs(effects(t, s.db)); got != "2" || len(openParked(t, ib, ReasonGap)) != 0 {
				t.Fatalf("after heal: effects %s, open gaps %d", got, len(openParked(t, ib, ReasonGap)))
			}
		})
	}
}
