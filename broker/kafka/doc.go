// Package kafka is Ferry's Kafka adapter, built on franz-go
// (github.com/twmb/franz-go/pkg/kgo): a [Publisher] the relay uses and a
// [Consumer] the inbox uses, both behind the [broker] seam.
//
// # Publishing
//
// [NewPublisher] creates an idempotent producer with acks=all
// (kgo.RequiredAcks(kgo.AllISRAcks()); idempotency is franz-go's default
// and is kept on). Each event becomes one record:
//
//   - topic = ferry.Event.Topic (the outbox row's topic);
//   - key = [ferry.AggregateKey](tenant, aggregate_type, aggregate_id), so
//     the default murmur2 partitioner puts every event of an aggregate on one
//     partition, where Kafka keeps them in order;
//   - headers = CloudEvents 1.0 binary mode for the Kafka binding (ce_id,
//     ce_source, ce_type, ce_subject, ce_time, ce_specversion, ce_sequence,
//     ce_partitionkey, ce_traceparent, ce_correlationid, ce_causationid,
//     ce_tenantid, ce_schemaversion, … and content-type), written by
//     [github.com/ferryhq/ferry/broker/cloudevents]; value = payload.
//
// [Publisher.Publish] hands every record of the batch to the producer
// before waiting for any acknowledgement (pipelining), then waits for all
// of them or for ctx. The receipt is topic/partition/offset. The idempotent
// producer retries internally without duplicating or reordering a
// partition, and when a record fails, franz-go fails every later buffered
// record of that partition too, so a later event of an aggregate is never
// stored ahead of an earlier failed one. Events refused before sending
// (empty topic, record above [WithMaxRecordBytes], default 1,000,000 bytes)
// fail alone, and the later events of their aggregate in the same call are
// not sent (ClassNotSent), so Kafka never stores event n+1 of an aggregate
// without event n. One limit remains: if the broker itself rejects a record
// (e.g. a topic's max.message.bytes below the client's limit) while later
// records of the aggregate are already in flight in another request, those
// may be stored; the inbox's gap parking restores order for consumers.
//
// # Error classes
//
// [Classify] maps produce errors onto broker classes using kerr's typed
// errors and franz-go's sentinels, never strings:
//
//   - ClassPermanent: MESSAGE_TOO_LARGE (client- or broker-side),
//     RECORD_LIST_TOO_LARGE, INVALID_RECORD, CORRUPT_MESSAGE, invalid topic,
//     authorization and policy failures.
//   - ClassNotSent marked [broker.ErrDestinationMissing]:
//     UNKNOWN_TOPIC_OR_PARTITION (the topic does not exist: auto-creation is
//     off on purpose). Kafka calls it retriable, and a topic created a
//     moment later makes the same record succeed: a configuration fault
//     the relay holds and reports, not a poison event.
//   - ClassIndeterminate: REQUEST_TIMED_OUT and
//     NOT_ENOUGH_REPLICAS_AFTER_APPEND (the leader may have appended the
//     record), the caller's ctx ending while records are in flight (the
//     idempotent producer never abandons a sent request, so they may still be
//     written), and anything unknown.
//   - ClassNotSent: other retriable broker errors (the broker refused before
//     appending: NOT_LEADER, NOT_ENOUGH_REPLICAS, …), client closed, buffer
//     full, and records failed by franz-go's delivery timeout with no
//     after-send cause — with the idempotent producer franz-go fails a
//     record only when that is safe (it was never sent, or the broker
//     answered). This reasoning assumes idempotency: disabling it through
//     [WithKgoOpts] voids it.
//
// # Durability preconditions
//
// An acknowledgement is only as good as the cluster's settings. For the
// relay's "mark sent after ack" to mean "will not be lost":
//
//   - replication factor ≥ 3 for every destination topic in production
//     ([RecommendedReplication]);
//   - min.insync.replicas ≥ 2 on those topics, so acks=all waits for at
//     least two copies;
//   - unclean.leader.election.enable=false, so an out-of-sync replica never
//     becomes leader and truncates acknowledged records;
//   - topics exist before the relay starts (auto-creation is off in the
//     producer): [EnsureTopics] creates missing ones (the relay's
//     --provision) with min.insync.replicas=min(2, replication) and unclean
//     election off, and [CheckTopics] is the start-up check; it reports
//     durability shortfalls as warnings (a one-broker development cluster is
//     legitimate) and missing topics as [ErrTopicMissing].
//
// Kafka flushes to disk asynchronously by default and relies on replication
// for durability; acks=all with the settings above is what makes an ack
// survive a broker loss.
//
// Ordering across partition-count changes is not preserved: adding
// partitions moves aggregates to other partitions. EnsureTopics never
// changes an existing topic.
//
// # Consuming
//
// [NewConsumer] joins a consumer group with autocommit disabled and, for a
// group with no committed offset, starts at the beginning of each partition.
// [Consumer.Consume] calls handle from one goroutine, in partition order;
// Delivery.Ack and Delivery.Nack may be called later from any goroutine in
// any order.
//
// Commits: per partition the consumer tracks the delivered offsets and
// which were acked, and commits only the contiguous acked prefix — the
// offset of the first record not yet acked. A record acked out of order
// therefore never lets the committed offset pass an earlier un-acked one:
// after a crash everything from the first un-acked record on is delivered
// again (duplicates, which the inbox absorbs; never a loss). Commits happen
// every [WithCommitInterval] (default 1s), on partition revoke (before the
// partition moves to another member, serialised with the periodic commit)
// and when Consume returns. Acks for a partition that was revoked or lost
// are ignored: the next owner redelivers from the committed offset.
//
// Nack and redelivery (the mechanism): Kafka has no per-record redelivery.
// Nack(delay) marks a rewind of that partition to the nacked offset, due
// after delay; between polls (while rebalances are blocked,
// kgo.BlockRebalanceOnPoll) the consume loop applies due rewinds with
// kgo.Client.SetOffsets, which drops buffered data for the partition and
// refetches from the nacked record. So the nacked record is handed to
// handle again after the delay, followed by every later record of the
// partition in their original order — partition order is preserved, and
// later records that were already acked come again as duplicates. Several
// nacks of one partition coalesce into one rewind to the lowest offset, due
// at the earliest deadline (delays are therefore best effort).
//
// Attempt counts deliveries of an offset within this consumer instance
// (1 = first). Kafka keeps no delivery count: after a restart or rebalance
// it starts at 1 again.
//
// Records that are not valid Ferry CloudEvents are delivered with
// DecodeErr set and Raw filled (topic, key, headers, value) — never
// dropped — so the inbox can park them and ack.
//
// Group membership and recovery after a crash: a consumer process that
// dies without leaving (SIGKILL, OOM, power loss) keeps its partitions until
// its session times out ([WithSessionTimeout], default 45s), and a
// rebalance started meanwhile waits for it, up to [WithRebalanceTimeout]
// (default 60s). [WithInstanceID] makes the consumer a static member
// (KIP-345): restarted under the same id it takes the partitions back at
// once, without a rebalance — measured on kfake, SIGKILL and restart to
// first delivery: 45.0s by default, 6.0s with a 6s session, 0.02s as a
// static member. Cooperative-sticky balancing ([WithBalancers], the
// default) moves only the partitions that must move. The options document
// their trade-offs.
//
// [Consumer.Lag] reports the group's lag (log end offset minus committed
// offset) per partition, via kadm, for metrics.
//
// # Testing
//
// The tests run against franz-go's kfake, an in-process cluster speaking
// the Kafka wire protocol, including the shared conformance suite
// ([github.com/ferryhq/ferry/broker/brokertest]), outages injected with
// kfake faults, connection cuts and a cluster restart, and an
// interoperability test decoding every record with the official
// CloudEvents SDK Kafka binding.
package kafka
