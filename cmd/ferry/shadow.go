package main

import (
	"context"
	"log/slog"

	"github.com/ferryhq/ferry/broker"
	"github.com/ferryhq/ferry/shadow"
)

// shadowTopics is the destination check's view of the unsent rows' topics:
// prefixed in shadow mode, so the relay checks the shadow destinations.
func shadowTopics(f *relayFlags, rows []string) []string {
	if f.shadowPrefix == "" {
		return rows
	}
	return shadow.Topics(f.shadowPrefix, rows)
}

// shadowPublisher wraps pub in shadow mode (--shadow-subject-prefix).
func shadowPublisher(ctx context.Context, f *relayFlags, log *slog.Logger, pub broker.Publisher) (broker.Publisher, error) {
	if f.shadowPrefix == "" {
		return pub, nil
	}
	sp, err := shadow.NewPublisher(pub, f.shadowPrefix)
	if err != nil {
		return nil, err
	}
	log.InfoContext(ctx, "shadow mode: events go to prefixed destinations, consumers of the real ones do not see them", "prefix", f.shadowPrefix)
	return sp, nil
}
