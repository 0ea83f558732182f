// Package rabbitmq is Ferry's RabbitMQ adapter over AMQP 0-9-1, built on
// github.com/rabbitmq/amqp091-go: a [Publisher] for the relay and a
// [Consumer] for the inbox, behind the [broker] seam.
//
// # Publishing
//
// The publisher keeps one connection with one channel in confirm mode
// (publisher confirms, ch.Confirm(false)) and, after the connection or the
// channel is lost, opens new ones on the next call, so the relay keeps one
// Publisher for its lifetime. Each event is published
//
//   - to the exchange set by [WithExchange] (default "ferry", a durable
//     topic exchange), with routing key = ferry.Event.Topic (the outbox
//     row's topic, e.g. "order.events"; queues bind to it with topic
//     patterns such as "order.*" or "#");
//   - persistent (delivery mode 2), mandatory, message-id = event id (the
//     broker-native id consumers may dedup on);
//   - with CloudEvents 1.0 attributes in "cloudEvents:*" headers
//     (cloudEvents:id, cloudEvents:source, cloudEvents:type,
//     cloudEvents:sequence, cloudEvents:partitionkey, …) written by
//     [github.com/ferryhq/ferry/broker/cloudevents], and datacontenttype in
//     the AMQP content-type property.
//
// [Publisher.Publish] writes every message of the batch (pipelined) and
// then waits for every confirm, bounded by ctx. Outcomes, per message:
//
//   - basic.ack → success; the receipt is exchange + routing key + the
//     channel's delivery tag.
//   - basic.return before the ack → ClassNotSent [ErrUnroutable], marked
//     [broker.ErrDestinationMissing]: no queue is bound for the routing
//     key, a configuration fault the relay holds (never dead) and
//     reports until a queue is bound. The
//     broker acks an unroutable message after returning it; without
//     mandatory it would just drop it and ack — a silent loss. Ferry never
//     counts a returned message as sent. amqp091 hands the return to the
//     listener before it processes the following ack, so a confirmed
//     message's return is always seen.
//   - basic.nack → ClassNotSent [ErrNacked].
//   - body above [WithMaxMessageBytes] → ClassPermanent [ErrTooLarge]
//     (checked before sending: the broker would close the whole channel).
//   - channel closed with 404 (exchange missing) → ClassNotSent
//     [ErrExchangeNotFound], marked [broker.ErrDestinationMissing].
//   - connection or channel lost after the message was written and before
//     its confirm, or ctx ended while waiting → ClassIndeterminate
//     ([ErrConnectionLost]).
//   - no connection, or the channel closed before the write → ClassNotSent.
//
// Events refused before sending (empty topic, too large) hold back the
// later events of their aggregate in the same call (ClassNotSent), so a
// queue never gets event n+1 of an aggregate without event n.
//
// [Publisher.Stats] counts published, confirmed, nacked, returned and
// unconfirmed messages and reconnects; Publish never reports success for a
// message whose confirm it did not see.
//
// AMQP channels keep publish order and a queue is FIFO, so events of one
// aggregate, published in order by the relay, reach a queue in order. With
// several queues bound, each gets them in order.
//
// # Durability preconditions
//
// A confirm means "the broker took responsibility"; what that is worth
// depends on the destination:
//
//   - quorum queues (x-queue-type: quorum): the confirm is sent after a
//     majority of replicas have written the message to disk. Classic
//     queues confirm a persistent message once it is written (and fsynced
//     in batches) on one node only.
//   - persistent messages (set by the publisher) and a durable exchange and
//     queue, so a broker restart keeps them;
//   - mandatory (set by the publisher) so unroutable messages are reported
//     instead of acked and dropped;
//   - confirms (set by the publisher): without them publish is
//     fire-and-forget.
//
// [EnsureTopology] declares the durable topic exchange, the quorum queue and
// its bindings (the relay's --provision). [CheckTopology] is the start-up
// check: passive declarations prove the exchange and queue exist, and an
// equivalent re-declaration, which RabbitMQ refuses with 406 when the
// existing entity differs, proves the exchange is a durable topic exchange
// and the queue a durable quorum queue ([ErrNotDurable] otherwise).
// Bindings cannot be inspected over AMQP 0-9-1; a missing one shows up as
// [ErrUnroutable] on the first publish.
//
// # Consuming
//
// [Consumer.Consume] consumes one queue with manual acks and a Qos prefetch
// window ([WithPrefetch]), calling handle from one goroutine in delivery
// order, and reconnects with exponential backoff when the connection is
// lost. Delivery.Ack is basic.ack of that delivery tag alone
// (multiple=false); amqp091 serialises a channel's frame writes, so Ack and
// Nack are safe from any goroutine and in any order. After the channel a
// delivery came on has closed, Ack returns [ErrChannelGone]: the broker
// requeues every message left unacked on a closed channel, so it will come
// again (a duplicate for the inbox to absorb, never a loss).
//
// Nack(delay) requeues the message (basic.nack with requeue) after delay;
// RabbitMQ has no delayed requeue, so the message stays unacked — holding a
// prefetch slot — until then. Attempt comes from the quorum queue's
// x-delivery-count header (the number of earlier failed deliveries, so
// Attempt = x-delivery-count + 1); on queues without it a redelivered
// message counts as at least 2. Requeued messages go back to the head of
// a quorum queue, but messages delivered meanwhile are not held back:
// per-aggregate order after a nack is restored by the inbox's cursor.
//
// Messages that are not valid Ferry CloudEvents are delivered with
// DecodeErr set and Raw filled (queue, routing key, headers with the
// content-type property under "content-type", body) — never dropped.
//
// # Testing
//
// The tests run against the local RabbitMQ (internal/testenv), each with
// its own exchange and quorum queue deleted at cleanup, including the
// shared conformance suite ([github.com/ferryhq/ferry/broker/brokertest]).
// Outages are produced by a TCP proxy the test controls between client and
// broker (freeze: bytes swallowed; cut: connections closed and refused),
// never by stopping the shared server.
package rabbitmq
