package outbox

import (
	"fmt"
	"time"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
)

// normalize fills the assigned fields of e, the event at index idx of a
// call, after validation: ID (UUIDv7), ContentType, OccurredAt (UTC now),
// Topic (rendered from tmpl and checked: a template of valid parts can still
// render a topic that is too long) and Shard.
func normalize(idx int, e *ferry.Event, tmpl ferry.TopicTemplate, shards int, now time.Time) error {
	if e.ID == uuid.Nil {
		id, err := ferry.NewEventID()
		if err != nil {
			return fmt.Errorf("outbox: generate event id: %w", err)
		}
		e.ID = id
	}
	if e.ContentType == "" {
		e.ContentType = ferry.DefaultContentType
	}
	if e.OccurredAt.IsZero() {
		e.OccurredAt = now
	}
	e.OccurredAt = e.OccurredAt.UTC()
	if e.Topic == "" {
		topic, err := tmpl.Topic(idx, e)
		if err != nil {
			return err
		}
		e.Topic = topic
	}
	e.Shard = ferry.ShardFor(e.TenantID, e.AggregateType, e.AggregateID, shards)
	return nil
}
