// Package command makes commands idempotent at the producer's edge: a client
// (a person behind a flaky network, a service with a retry policy, an AI
// agent that re-plans) that sends the same command twice must not create a
// second order, and must get the same answer both times.
//
// # How
//
// [Runner.Run] runs a command function in one database transaction together
// with a row in the command_keys table keyed by (tenant, idempotency key),
// holding a fingerprint of the request and, once the function returned, its
// [Result]: the response body to replay and the ids of the events the command
// wrote through the outbox. Because the key row, the business rows and the
// outbox rows commit together, there is no window in which the command ran
// but its key is missing (or the reverse):
//
//   - first call: the key row is inserted, fn runs, the outcome is stored,
//     everything commits;
//   - retry with the same key and fingerprint: fn does not run; the stored
//     [Outcome] is returned with Replayed = true;
//   - same key, different fingerprint: a [*KeyReusedError] (matches
//     [ErrIdempotencyKeyReused]); nothing runs. Return HTTP 422 or 409;
//   - concurrent calls with one key: the first inserts the key row; the others
//     block on that uncommitted row (Postgres: the primary-key index entry;
//     SQLite: the database write lock) and, once it commits, replay its
//     outcome. If the first call fails, its row rolls back and one waiter
//     runs the command instead;
//   - fn returns an error: everything rolls back, nothing is stored, a retry
//     runs fn again. Store business rejections ("insufficient stock") as a
//     Result, not an error, if retries must see the same rejection.
//
// The fingerprint is SHA-256 of [Request].Body, which must be the caller's
// canonical encoding of the request (the same logical request gives the same
// bytes), or a caller-computed [Request].Fingerprint.
//
// # Expiry
//
// Keys are remembered for [WithExpiry] (default 48h); after that a retry runs
// the command again. The expiry must be at least the replay window declared
// with [WithReplayWindow] — [New] refuses a shorter one with an error naming
// both durations — because a command retried or replayed after its key was
// forgotten runs twice. [Runner.Cleanup] deletes expired keys in small
// batches; run it periodically.
//
// # Transactions
//
// Calls come in pairs as in the rest of Ferry: [Runner.Run] owns its
// transaction, [Runner.RunTx] joins the caller's (roll it back if RunTx
// returns an error). The command function receives the transaction in the
// driver's own type (pgx.Tx or *sql.Tx), so it can call
// outbox.Writer.InsertTx directly:
//
//	r, _ := command.New(pgxv5.New(pool), command.WithReplayWindow(24*time.Hour))
//	out, err := r.Run(ctx, command.Request{TenantID: "acme", Key: key, Body: canonical},
//		func(ctx context.Context, tx pgx.Tx) (command.Result, error) {
//			// insert the order ...
//			evs, err := w.InsertTx(ctx, tx, ferry.Event{...})
//			if err != nil {
//				return command.Result{}, err
//			}
//			return command.Result{Body: resp, EventIDs: []uuid.UUID{evs[0].ID}}, nil
//		})
//
// Logs and errors name the tenant and key, never the body.
package command
