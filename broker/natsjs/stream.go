package natsjs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// DefaultDuplicateWindow is the dedup horizon EnsureStream uses when
// StreamConfig.DuplicateWindow is zero: JetStream's own default.
const DefaultDuplicateWindow = 2 * time.Minute

// StreamConfig describes the stream a Publisher writes into.
type StreamConfig struct {
	// Name of the stream, e.g. "FERRY_ORDERS".
	Name string
	// Subjects the stream captures, e.g. ["order.events"] or ["order.>"].
	// They must cover every subject the publisher derives from event topics.
	Subjects []string
	// DuplicateWindow is how long JetStream remembers a Nats-Msg-Id: a
	// re-publish of the same event id within it is acknowledged as a
	// duplicate and not stored again. Default DefaultDuplicateWindow.
	DuplicateWindow time.Duration
	// Replicas is the number of copies in a cluster (1 on a single server).
	// Default 1.
	Replicas int
	// MaxMsgSize, when > 0, makes the stream reject larger messages.
	MaxMsgSize int32
}

// ErrStreamNotDurable reports a stream CheckStream refuses: memory storage
// or no duplicate window. See *StreamCheckError.
var ErrStreamNotDurable = errors.New("natsjs: stream is not durable enough for an outbox relay")

// StreamCheckError names the stream and what is wrong with it.
type StreamCheckError struct {
	Stream string
	Reason string
}

func (e *StreamCheckError) Error() string {
	return fmt.Sprintf("natsjs: stream %q: %s", e.Stream, e.Reason)
}

// Is reports ErrStreamNotDurable.
func (e *StreamCheckError) Is(target error) bool { return target == ErrStreamNotDurable }

func (c StreamConfig) validate() error {
	if c.Name == "" {
		return errors.New("natsjs: StreamConfig.Name must not be empty")
	}
	if len(c.Subjects) == 0 {
		return errors.New("natsjs: StreamConfig.Subjects must not be empty")
	}
	if c.DuplicateWindow < 0 {
		return fmt.Errorf("natsjs: StreamConfig.DuplicateWindow %v must be >= 0", c.DuplicateWindow)
	}
	if c.Replicas < 0 || c.Replicas > 5 {
		return fmt.Errorf("natsjs: StreamConfig.Replicas %d must be 0..5", c.Replicas)
	}
	if c.MaxMsgSize < 0 {
		return fmt.Errorf("natsjs: StreamConfig.MaxMsgSize %d must be >= 0", c.MaxMsgSize)
	}
	return nil
}

// EnsureStream creates the stream when it does not exist: file storage,
// limits retention, the configured duplicate window and replicas. An
// existing stream is not modified; it is checked with CheckStream instead,
// so a deployment's hand-tuned stream is never silently rewritten.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s, err := js.Stream(ctx, cfg.Name)
	if err == nil {
		if err := checkInfo(s.CachedInfo(), cfg); err != nil {
			return nil, err
		}
		return s, nil
	}
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("natsjs: look up stream %q: %w", cfg.Name, err)
	}
	dup := cfg.DuplicateWindow
	if dup == 0 {
		dup = DefaultDuplicateWindow
	}
	rep := cfg.Replicas
	if rep == 0 {
		rep = 1
	}
	sc := jetstream.StreamConfig{
		Name:        cfg.Name,
		Description: "Ferry outbox events",
		Subjects:    cfg.Subjects,
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Duplicates:  dup,
		Replicas:    rep,
		MaxMsgSize:  cfg.MaxMsgSize,
		MaxMsgs:     -1,
		MaxBytes:    -1,
		MaxAge:      0,
		Discard:     jetstream.DiscardOld,
	}
	for attempt := 1; ; attempt++ {
		s, err = js.CreateStream(ctx, sc)
		if err == nil {
			return s, nil
		}
		if attempt == storeFailedAttempts || !isStoreFailed(err) {
			return nil, fmt.Errorf("natsjs: create stream %q: %w", cfg.Name, err)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("natsjs: create stream %q: %w (after %w)", cfg.Name, ctx.Err(), err)
		case <-time.After(time.Duration(attempt) * 50 * time.Millisecond):
		}
	}
}

// storeFailedAttempts bounds EnsureStream's retries of "error creating
// store for stream" (10049). nats-server (2.9 to 2.15 at least) deletes a
// stream's directory and then, in a goroutine, the account's streams
// directory and the account directory if they are empty; a stream created
// meanwhile can find its parent gone ("could not create storage directory
// - mkdir …/jetstream/$G/streams: no such file or directory"). It happens
// when the account's last stream was deleted a moment before — about 1 in
// 700 delete-then-create pairs on the embedded server — and a second
// attempt finds the directories settled. A store that cannot be created
// for another reason (permissions, a full disk) fails the same way each
// time and is reported after the last attempt.
const storeFailedAttempts = 4

// jsErrCodeStreamStoreFailed is the server's JSStreamStoreFailedF.
const jsErrCodeStreamStoreFailed jetstream.ErrorCode = 10049

func isStoreFailed(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeStreamStoreFailed
}

// CheckStream verifies that the stream exists, is file-backed, does not
// use asynchronous persistence (server 2.12+), has a duplicate window, at least cfg.Replicas replicas and captures every
// subject in cfg.Subjects (listed verbatim in its configuration). The relay
// calls it at start and refuses to run on a stream that could lose or
// double-store acknowledged events; --provision creates the stream with
// EnsureStream instead.
func CheckStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) error {
	if cfg.Name == "" {
		return errors.New("natsjs: StreamConfig.Name must not be empty")
	}
	s, err := js.Stream(ctx, cfg.Name)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return &StreamCheckError{Stream: cfg.Name, Reason: "does not exist (create it, or run with --provision)"}
		}
		return fmt.Errorf("natsjs: look up stream %q: %w", cfg.Name, err)
	}
	return checkInfo(s.CachedInfo(), cfg)
}

func checkInfo(info *jetstream.StreamInfo, want StreamConfig) error {
	c := info.Config
	bad := func(format string, args ...any) error {
		return &StreamCheckError{Stream: c.Name, Reason: fmt.Sprintf(format, args...)}
	}
	if c.Storage != jetstream.FileStorage {
		return bad("storage is %s, want file (memory streams lose acknowledged events on restart)", c.Storage)
	}
	if c.PersistMode == jetstream.AsyncPersistMode {
		return bad("uses persist_mode async (acknowledged before written; server 2.12+ option)")
	}
	if c.Duplicates <= 0 {
		return bad("has no duplicate window (a re-published event would be stored twice)")
	}
	if want.Replicas > 0 && c.Replicas < want.Replicas {
		return bad("has %d replicas, want at least %d", c.Replicas, want.Replicas)
	}
	for _, sub := range want.Subjects {
		if !slices.Contains(c.Subjects, sub) {
			return bad("does not capture subject %q (its subjects: %v)", sub, c.Subjects)
		}
	}
	return nil
}
