// Package brokertest is the conformance suite every broker adapter runs,
// so adapters cannot drift from the contract in package broker.
//
// An adapter's test declares its [Capabilities] and provides a [Harness]
// whose Setup gives each test an isolated destination (unique stream,
// topic or queue) through an [Env]: a publisher constructor, a consumer
// constructor (all consumers of one Env share one durable position), the
// topic to put on events, and optionally PublishRaw (to inject an
// undecodable message) and Outage (to make the broker unavailable and
// back). [Run] then checks:
//
//   - PublishConsumeOrderAndReceipts: 60 events over 6 aggregates in
//     batches of 7; every event arrives once with every field intact, Raw
//     filled, Attempt 1; per-aggregate order equals publish order when
//     OrderedByKey; every receipt names the broker and destination.
//   - DuplicateEventID: the same event id published twice is delivered once
//     iff DedupByEventID (twice otherwise), and the second receipt has
//     Duplicate = true iff ReportsDuplicate.
//   - NackRedelivers: Nack(0) brings the message back with Attempt 2, and an
//     acked message does not come back.
//   - RestartRedeliversUnacked: acks sent from other goroutines in reverse
//     order for all but one message; after a consumer restart the unacked
//     one is redelivered (at-least-once over out-of-order acks — the rule a
//     Kafka adapter implements by committing only contiguous offsets).
//   - AckedNotRedelivered: everything acked out of order; after a restart
//     none of it comes back.
//   - OversizedIsPermanent: a payload of OversizedPayload bytes fails with
//     ClassPermanent, without echoing the payload, while another aggregate
//     in the same batch succeeds.
//   - UndecodableDelivered: a raw non-CloudEvents message is delivered with
//     DecodeErr and Raw set, and can be acked (parked, never dropped).
//   - ConsumeStopsOnCancel: Consume returns nil promptly after cancel.
//   - OutageClassifiedAndRecovers: during an outage every publish fails as
//     ClassNotSent or ClassIndeterminate (never ClassPermanent, which would
//     dead-letter rows because of an outage) and Ping fails; after recovery
//     the same events re-published (same ids, as the relay does) all arrive.
//
// A check is skipped only when its capability or hook is absent; every
// skip names the reason. [Proxy] is a TCP proxy for outage tests against a
// shared broker that must not be stopped.
//
// Usage, in an adapter's _test.go:
//
//	func TestConformance(t *testing.T) {
//		brokertest.Run(t, brokertest.Harness{
//			Capabilities: brokertest.Capabilities{OrderedByKey: true, Redelivers: true, ...},
//			Setup: func(t *testing.T) *brokertest.Env {
//				// create a unique destination, register its cleanup
//				return &brokertest.Env{Topic: ..., NewPublisher: ..., NewConsumer: ...}
//			},
//		})
//	}
package brokertest
