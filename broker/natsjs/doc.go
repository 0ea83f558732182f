// Package natsjs is Ferry's NATS JetStream adapter: a [Publisher] for the
// relay, a durable pull [Consumer] for the inbox, stream provisioning
// ([EnsureStream], [CheckStream]) and an in-process server ([StartEmbedded])
// for the embedded stack and for outage tests.
//
// (Full documentation follows in a later commit.)
package natsjs
