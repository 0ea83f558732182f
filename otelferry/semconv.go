package otelferry

import (
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Span names and attributes follow the OpenTelemetry semantic conventions
// for messaging spans (semconv v1.43.0): "{operation} {destination}" names,
// producer spans for "send" and consumer spans for "process", and the
// messaging.* attributes below. Ferry's own identifiers are added under
// ferry.*.

// Operation names, used as messaging.operation.name and as the first word
// of the span name.
const (
	OperationSend    = "send"
	OperationProcess = "process"
)

// SpanName is "{operation} {destination}", or the operation alone when the
// destination is unknown or a batch spans several (the conventions forbid
// high-cardinality names; topics and subjects are low-cardinality).
func SpanName(operation, destination string) string {
	if destination == "" {
		return operation
	}
	return operation + " " + destination
}

// MessagingSystem maps a Ferry broker name (broker.Publisher.Name) to
// messaging.system: "kafka" and "rabbitmq" are the conventions' values;
// NATS has none registered and is reported as "nats".
func MessagingSystem(broker string) attribute.KeyValue {
	switch broker {
	case "kafka":
		return semconv.MessagingSystemKafka
	case "rabbitmq":
		return semconv.MessagingSystemRabbitMQ
	}
	return semconv.MessagingSystemKey.String(broker)
}

// SendAttributes are the attributes of the relay's publish span for a batch
// of count messages to destination ("" when they go to several).
func SendAttributes(broker, destination string, count int) []attribute.KeyValue {
	a := []attribute.KeyValue{
		MessagingSystem(broker),
		semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName(OperationSend),
		semconv.MessagingBatchMessageCount(count),
	}
	if destination != "" {
		a = append(a, semconv.MessagingDestinationName(destination))
	}
	return a
}

// ProcessAttributes are the attributes of the inbox's apply span for one
// message; broker is "" for a replay (no messaging.system then).
func ProcessAttributes(broker, destination, messageID, consumerGroup string) []attribute.KeyValue {
	a := []attribute.KeyValue{
		semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName(OperationProcess),
		semconv.MessagingMessageID(messageID),
		semconv.MessagingConsumerGroupName(consumerGroup),
	}
	if broker != "" { // a replay from the parked table has no broker
		a = append(a, MessagingSystem(broker))
	}
	if destination != "" {
		a = append(a, semconv.MessagingDestinationName(destination))
	}
	return a
}
