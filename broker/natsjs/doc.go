// Package natsjs is Ferry's NATS JetStream adapter: a [Publisher] for the
// relay, a durable pull [Consumer] for the inbox, stream provisioning
// ([EnsureStream], [CheckStream]) and an in-process server
// ([natsembed.Start]) for the embedded stack and for outage tests. It uses
// nats.go's jetstream package and writes CloudEvents 1.0 binary mode
// through [github.com/ferryhq/ferry/broker/cloudevents] (headers "ce-…",
// "content-type"), so any CloudEvents SDK reads the messages.
//
// # Publishing
//
// The subject of an event is its Topic (default template
// "{aggregate_type}.events", e.g. "order.events"); [WithSubject] replaces
// the mapping, e.g. topic + "." + tenant for per-tenant filtering. Every
// subject must be captured by one stream, and all events of an aggregate
// must land in the same stream: a stream stores messages in arrival order,
// which is what keeps per-aggregate order.
//
// [Publisher.Publish] sends a batch pipelined (PublishMsgAsync) in slice
// order on one connection and then waits for every PubAck. Each message
// carries Nats-Msg-Id = event id (the CloudEvents map itself has only ce-
// attributes; the adapter adds the Nats-Msg-Id header beside them).
// The receipt is {broker "nats", destination = stream, key = subject,
// offset = stream sequence, duplicate = PubAck.Duplicate}. The client's
// automatic retry after "no responders" is switched off: it would re-send a
// message after later ones and break order; the relay retries instead.
//
// Order under failure: if an event cannot be sent at all (client-side
// rejection), later events of the same aggregate in the same call are not
// sent either (ClassNotSent). A failure after sending (no ack in time,
// disconnection while waiting) cannot be undone: later events of that
// aggregate may already be stored, and the relay's retry of the failed one
// is stored after them. The inbox's sequence check (gap → park, applied
// in order once the missing one arrives) absorbs this.
//
// # Error classes
//
//	ClassNotSent        connection closed/draining/disconnected at send
//	                    (Connect disables the reconnect buffer so this fails
//	                    fast), too many pending publishes, "no responders"
//	                    while a stream for the subject exists (JetStream
//	                    momentarily unavailable), an error reply from the
//	                    stream (e.g. insufficient resources); no stream
//	                    captures the subject ("no responders" and
//	                    StreamNameBySubject finds none), marked
//	                    broker.ErrDestinationMissing: a configuration fault
//	                    the relay holds (never dead) until a stream
//	                    captures the subject
//	ClassIndeterminate  no PubAck within the ack timeout, disconnected while
//	                    waiting, ctx ended while waiting: the message may be
//	                    stored; the retry is absorbed by the duplicate window
//	ClassPermanent      larger than the server's max_payload (nats.ErrMaxPayload,
//	                    checked by the client before sending) or the stream's
//	                    max_msg_size (JetStream error 10054); invalid subject
//
// [Publisher.Ping] is an AccountInfo round trip: it fails while the server
// is unreachable or JetStream is disabled, which the relay's circuit
// breaker uses instead of burning row attempts.
//
// # Durability preconditions
//
// An acknowledgement is only as good as the stream behind it. [CheckStream]
// (run by the relay at start) refuses a stream that is memory-backed, uses
// asynchronous persistence (persist_mode async, server 2.12+), has no
// duplicate window, has fewer replicas than configured, or does not capture
// the configured subjects; [EnsureStream] (the relay's --provision)
// creates a file-backed stream with a duplicate window when it is missing
// and never rewrites an existing one. Beyond what the API can check:
//
//   - fsync: JetStream acknowledges a message once written to the file
//     (the OS page cache) and fsyncs on an interval — 2 minutes by default
//     on current servers. A process crash loses nothing; an OS crash or power
//     loss can lose acknowledged messages from the last interval. Set
//     jetstream { sync_interval: always } (server 2.10+; 2.9.x has no such
//     option) or run R3 streams across failure domains. The embedded server
//     takes natsembed's WithSyncAlways / WithSyncInterval.
//   - replicas: on a cluster use Replicas: 3; the PubAck then means a
//     quorum stored the message.
//   - duplicate window: it is the broker's dedup horizon. A relay retry of
//     the same event id within it is acknowledged with Duplicate = true and
//     the original sequence, not stored again; after it, the message is
//     stored twice and the consumer's inbox dedups. Choose a window longer
//     than the relay's longest plausible retry delay (default 2 minutes;
//     the server keeps the ids of the window in memory).
//   - retention: limits retention, no max age by default; a stream that
//     discards messages before consumers read them breaks G2.
//
// # Consuming
//
// [NewConsumer] creates or updates a durable pull consumer (explicit ack,
// deliver all, AckWait default 5s, MaxDeliver unlimited, MaxAckPending
// 4096). [Consumer.Consume] delivers in stream order from one goroutine; a
// message that is not a valid Ferry CloudEvent is delivered with DecodeErr
// set and Raw filled so the inbox can park it. Delivery.Attempt is the
// server's NumDelivered. Delivery.Ack is a double ack (the server confirms
// it; a nil error means no redelivery), Delivery.Nack is a NAK with delay.
// MaxAckPending is the back-pressure: the server stops delivering while
// that many messages are unacked. [Consumer.Pending] returns the consumer's
// num_pending, the lag metric. Consume's pull requests carry a one-second
// idle heartbeat ([DefaultPullHeartbeat]): when two are missed, because
// the node holding the request died or the client skipped a re-pull, the
// iterator pulls again, so a consumer resumes within seconds of a leader
// loss instead of stalling.
//
// A live Consumer sends InProgress for every message it holds each
// AckWait/3, so AckWait bounds only how long the messages of a consumer
// that died (SIGKILL, lost host) wait before redelivery, not the
// transaction. [Consumer.Close] naks every delivered, unsettled message
// and Consume naks what it pulled but never handed out, so a graceful stop
// hands them to another consumer at once. A message the server was still
// sending to the closing subscription (at most one pull batch) reaches no
// client and waits for AckWait. [Consumer.InFlightLimits]
// reports MaxAckPending, the pull batch and AckWait for inbox.Run's sizing
// check (it warns when MaxAckPending is below twice the inbox's in-flight
// bound: a restart after a crash would find few free slots).
//
// # Embedded server
//
// Package github.com/ferryhq/ferry/broker/natsjs/natsembed, kept apart so
// that users of a real NATS cluster do not link nats-server, runs
// nats-server (the version in go.mod, 2.15.x) in process on a random
// 127.0.0.1 port with a temporary or given store directory. Its
// Server.Shutdown stops it and waits; Server.Restart brings it back on the
// same port and store, which outage tests use; Server.Close also removes a
// temporary store.
//
// # Server versions
//
// Everything here is tested against NATS 2.9.10 (the system server) and the
// embedded 2.15.x. Features needing newer servers: sync_interval (2.10+),
// persist_mode (2.12+; CheckStream's async check is a no-op before, the
// field is absent). Not used by Ferry: multiple consumer filter subjects
// (2.10+), TermWithReason (2.10.4+), per-message TTL (2.11+).
package natsjs
