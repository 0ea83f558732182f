package kafka

import (
	"context"
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/ferryhq/ferry/broker"
)

// permanentErrs will fail the same way on every retry: the record, the
// topic or the client's rights must change first.
var permanentErrs = []*kerr.Error{
	kerr.MessageTooLarge,
	kerr.RecordListTooLarge,
	kerr.InvalidRecord,
	kerr.CorruptMessage, // retriable in Kafka's table, but a record we built that the broker calls corrupt will stay so
	kerr.InvalidTopicException,
	kerr.TopicAuthorizationFailed,
	kerr.ClusterAuthorizationFailed,
	kerr.TransactionalIDAuthorizationFailed,
	kerr.PolicyViolation,
	kerr.InvalidRequiredAcks,
	kerr.InvalidTimestamp,
	kerr.UnsupportedForMessageFormat,
	kerr.UnsupportedCompressionType,
}

// indeterminateErrs are answers given after the broker may already have
// appended the record: the leader wrote it but could not confirm the
// replication that acks=all waits for.
var indeterminateErrs = []*kerr.Error{
	kerr.RequestTimedOut,
	kerr.NotEnoughReplicasAfterAppend,
}

// Classify maps a produce-promise error to Ferry's error classes. It uses
// kerr's typed errors and franz-go's sentinels, never message strings.
//
//   - Permanent: see permanentErrs (too large, invalid record, invalid topic
//     name, not authorised).
//   - NotSent marked broker.ErrDestinationMissing: UNKNOWN_TOPIC_OR_PARTITION,
//     which reaches the promise only after franz-go's unknown-topic retries
//     (the topic does not exist and auto-create is off). Kafka itself calls
//     it retriable (metadata propagation, a topic created a moment later):
//     it is a configuration fault the relay holds and reports, never a
//     reason to dead-letter the event. franz-go fails such a record before
//     producing it, or the broker refused it, so it was not stored.
//   - Indeterminate: REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS_AFTER_APPEND, and
//     anything unknown (the safe default: retry and rely on event-id dedup).
//   - NotSent: every other retriable kerr error (the broker refused before
//     appending: not leader, not enough replicas, …); client closed; buffer
//     full; a record failed by timeout, context or retries with no
//     after-send cause — with the idempotent producer franz-go fails a record
//     only when that is safe, i.e. it was never sent or the broker answered.
//
// Classify returns nil for nil.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, kerr.UnknownTopicOrPartition) {
		return broker.DestinationMissing("kafka topic", err)
	}
	return broker.NewError(classOf(err), err)
}

func classOf(err error) broker.Class {
	for _, k := range permanentErrs {
		if errors.Is(err, k) {
			return broker.ClassPermanent
		}
	}
	for _, k := range indeterminateErrs {
		if errors.Is(err, k) {
			return broker.ClassIndeterminate
		}
	}
	if kerr.IsRetriable(err) {
		return broker.ClassNotSent
	}
	var ke *kerr.Error
	if errors.As(err, &ke) {
		// A non-retriable broker error we do not know (sequence or
		// epoch trouble): assume the worst.
		return broker.ClassIndeterminate
	}
	switch {
	case errors.Is(err, kgo.ErrClientClosed),
		errors.Is(err, kgo.ErrMaxBuffered),
		errors.Is(err, kgo.ErrAborting):
		return broker.ClassNotSent
	case errors.Is(err, kgo.ErrRecordTimeout),
		errors.Is(err, kgo.ErrRecordRetries),
		errors.Is(err, context.Canceled),
		errors.Is(err, context.DeadlineExceeded):
		// These wrap the last broker error when there was one (handled
		// above); bare, the record was never answered-and-appended.
		return broker.ClassNotSent
	}
	return broker.ClassIndeterminate
}
