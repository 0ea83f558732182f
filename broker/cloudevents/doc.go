// Package cloudevents maps a [ferry.Event] onto CloudEvents 1.0 binary mode
// for each protocol binding Ferry publishes to, and back.
//
// Binary mode keeps the payload as the message body, untouched, and carries
// the event's context attributes as message headers. Headers are named
// exactly as the bindings define them, in lower case, so that the official
// CloudEvents SDKs decode Ferry's messages unchanged:
//
//	binding  attribute prefix   datacontenttype
//	NATS     ce-                header "content-type"
//	Kafka    ce_                header "content-type"
//	AMQP     cloudEvents:       AMQP content-type property
//
// Case matters: the CloudEvents Go SDK's NATS binding looks up
// "content-type" exactly and silently ignores "Content-Type", so a
// capitalised header loses the content type without an error.
//
// For AMQP the codec returns the content type in the map under
// [ContentTypeHeader] like the other bindings; the AMQP adapter
// (broker/rabbitmq) moves it into the message's content-type property and
// sets message-id = event id, and on receipt puts the property back under
// that key before calling [Decode].
//
// # Attribute mapping
//
//	CloudEvents          ferry.Event                        required on Decode
//	specversion          "1.0"                              yes
//	id                   ID (UUID, canonical form)          yes
//	source               EncodeOptions.Source ("ferry")     yes (value not kept)
//	type                 EventType                          yes
//	subject              AggregateID                        yes
//	time                 OccurredAt (RFC 3339, UTC, ns)     yes
//	datacontenttype      ContentType                        yes
//	dataschema           never set                          no (ignored)
//	sequence (ext)       AggregateSeq, decimal              yes, >= 1
//	partitionkey (ext)   ferry.AggregateKey(tenant,type,id) no; must match when present
//	tenantid (ext)       TenantID                           yes
//	aggregatetype (ext)  AggregateType                      yes
//	schemaversion (ext)  SchemaVersion, decimal             yes, >= 1
//	traceparent (ext)    Headers.Traceparent                no (omitted when empty)
//	correlationid (ext)  Headers.CorrelationID              no (omitted when empty)
//	causationid (ext)    Headers.CausationID                no (omitted when empty)
//	principal (ext)      Headers.Principal                  no (omitted when empty)
//	action (ext)         Headers.Action                     no (omitted when empty)
//	target (ext)         Headers.Target                     no (omitted when empty)
//
// Extension names are lower-case alphanumeric, as the specification
// requires (no underscores: correlation_id becomes correlationid).
//
// Topic is not an attribute: it is the message's destination, which the
// consumer knows. Shard is a producer-side detail and is not carried.
//
// # Broker-native ids
//
// The codec map contains CloudEvents attributes only. The adapters add the
// broker's own dedup identity, always equal to the event id: the NATS
// adapter sets Nats-Msg-Id (through jetstream.WithMsgID), the AMQP adapter
// sets the message-id property, and the Kafka adapter uses the partitionkey
// as the record key (Kafka's dedup is the idempotent producer, not the key).
//
// # Decoding untrusted input
//
// [Decode] treats headers as untrusted: it never panics, checks every
// required attribute, rejects invalid UTF-8 and control characters, accepts
// only canonical decimal numbers and UUIDs, and reports the first problem
// as a *[DecodeError] naming the attribute and header; every decode error
// matches [ErrNotCloudEvent]. A consumer parks such a message rather than
// dropping it. Headers are matched exactly first and then
// case-insensitively. Unknown attributes (other extensions) are ignored.
// Structured mode (the whole event as a JSON document with content type
// application/cloudevents+json) is not supported.
//
// Caveat: an event whose own ContentType is "application/cloudevents+json"
// is encoded in binary mode with that content-type header, which the
// CloudEvents SDKs take as the marker of structured mode; they will then
// try to parse the payload as a structured event. Prefer another content
// type for payloads that are not themselves structured CloudEvents.
//
// The round trip is exact: for every message m that Decode accepts,
// Decode(Encode(Decode(m))) equals Decode(m); FuzzDecode checks this.
package cloudevents
