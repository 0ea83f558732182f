// Package ferry is the user API of Ferry, a transactional outbox / inbox
// toolkit: the event model ([Event]), its validation ([Limits]), the table
// naming every store shares ([Tables]) and the errors callers branch on.
//
// The pieces that do the work live in packages named for what they do:
//
//   - [github.com/ferryhq/ferry/outbox] writes events in the caller's transaction (G1, G3).
//   - [github.com/ferryhq/ferry/migrate] creates and upgrades the tables.
//   - [github.com/ferryhq/ferry/driver] is the seam between Ferry's core and a
//     database library; [github.com/ferryhq/ferry/driver/pgxv5] and
//     [github.com/ferryhq/ferry/driver/databasesql] sit behind it.
//
// Ferry promises at-least-once publication and once-in-effect application.
// It never claims exactly-once delivery, global order across aggregates, or
// atomicity across services. See README.md for the guarantees table.
package ferry
