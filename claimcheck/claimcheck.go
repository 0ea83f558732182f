// Package claimcheck moves large payloads out of the outbox row: above a
// threshold the producer writes the payload to a blob store
// (gocloud.dev/blob; file:// is the embedded default) inside the call,
// before the transaction commits, and the event carries a small JSON
// reference (URI, size, SHA-256 digest, the data's own content type) whose
// content type is ContentType. The inbox (inbox.WithClaimCheck) fetches
// the blob and verifies size and digest before the handler; a missing
// blob or a digest mismatch parks the message with reason claimcheck.
//
// With encryption on, the producer encrypts first and offloads the
// envelope, so the blob store only ever holds ciphertext; the consumer
// fetches, then decrypts.
package claimcheck

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:// — the embedded default
	_ "gocloud.dev/blob/memblob"  // mem:// — tests
	"gocloud.dev/gcerrors"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/internal/logattr"
)

// ContentType is the datacontenttype of an event whose data is a
// reference; the data's own type travels in the reference.
const ContentType = "application/vnd.ferry.claimcheck+json"

// KeyPrefix prefixes every blob key this package writes; the sweeper
// only looks under it.
const KeyPrefix = "claimcheck/"

// DefaultMaxDataBytes bounds one offloaded payload (64 MiB).
const DefaultMaxDataBytes = 64 << 20

// Sentinel errors.
var (
	ErrMissing   = errors.New("claimcheck: blob missing")
	ErrDigest    = errors.New("claimcheck: digest or size mismatch")
	ErrMalformed = errors.New("claimcheck: malformed reference")
)

// Ref is the event's data when its payload was offloaded.
type Ref struct {
	URI         string `json:"uri"` // blob key within the store
	Size        int64  `json:"size"`
	Digest      string `json:"digest"` // "sha256:<hex>"
	ContentType string `json:"content_type"`
}

// Store offloads and fetches payloads. Safe for concurrent use.
type Store struct {
	bucket    *blob.Bucket
	location  string
	threshold int
	maxData   int
}

// Open opens the bucket at rawURL (file:///path, mem://, s3://…).
// Payloads larger than threshold bytes are offloaded.
func Open(ctx context.Context, rawURL string, threshold int) (*Store, error) {
	if threshold < 1 {
		return nil, &ferry.ConfigError{Field: "claimcheck.threshold", Reason: fmt.Sprintf("must be >= 1 byte, got %d", threshold)}
	}
	b, err := blob.OpenBucket(ctx, rawURL)
	if err != nil {
		return nil, fmt.Errorf("claimcheck: open %s: %w", logattr.RedactBlobURL(rawURL), err)
	}
	return &Store{bucket: b, location: logattr.RedactBlobURL(rawURL), threshold: threshold, maxData: DefaultMaxDataBytes}, nil
}

// Close closes the bucket.
func (s *Store) Close() error { return s.bucket.Close() }

// MaxDataBytes is the largest payload the producer accepts with this store.
func (s *Store) MaxDataBytes() int { return s.maxData }

// Key is the blob key of an event's payload.
func Key(id fmt.Stringer) string { return KeyPrefix + id.String() }

// OffloadEvents replaces the payload of every event above the threshold
// with a reference, writing the blob first. Called by the outbox inside
// the producer's call, before the row is written.
func (s *Store) OffloadEvents(ctx context.Context, events []ferry.Event) error {
	for i := range events {
		e := &events[i]
		if len(e.Payload) <= s.threshold {
			continue
		}
		if len(e.Payload) > s.maxData {
			return &ferry.ValidationError{Index: i, Field: "payload", Reason: fmt.Sprintf("%d bytes exceeds the claim-check limit of %d bytes", len(e.Payload), s.maxData)}
		}
		sum := sha256.Sum256(e.Payload)
		key := Key(e.ID)
		if err := s.bucket.WriteAll(ctx, key, e.Payload, &blob.WriterOptions{ContentType: "application/octet-stream"}); err != nil {
			return fmt.Errorf("claimcheck: write blob for event %s: %w", e.ID, err)
		}
		ct := e.ContentType
		if ct == "" {
			ct = ferry.DefaultContentType
		}
		ref, err := json.Marshal(Ref{URI: key, Size: int64(len(e.Payload)), Digest: "sha256:" + hex.EncodeToString(sum[:]), ContentType: ct})
		if err != nil {
			return fmt.Errorf("claimcheck: encode reference: %w", err)
		}
		e.Payload, e.ContentType = ref, ContentType
	}
	return nil
}

// Open returns ev with its payload fetched and verified; an event that is
// not a reference is returned unchanged.
func (s *Store) Open(ctx context.Context, ev ferry.Event) (ferry.Event, error) {
	if ev.ContentType != ContentType {
		return ev, nil
	}
	var r Ref
	if err := json.Unmarshal(ev.Payload, &r); err != nil {
		return ev, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if !strings.HasPrefix(r.URI, KeyPrefix) || r.Size < 0 || r.Size > int64(s.maxData) || !strings.HasPrefix(r.Digest, "sha256:") || r.ContentType == "" {
		return ev, fmt.Errorf("%w: uri, size (<= %d), digest or content type out of range", ErrMalformed, s.maxData)
	}
	rd, err := s.bucket.NewReader(ctx, r.URI, nil)
	if err != nil {
		if gcerrors.Code(err) == gcerrors.NotFound {
			return ev, fmt.Errorf("%w: %s", ErrMissing, r.URI)
		}
		return ev, fmt.Errorf("claimcheck: read %s: %w", r.URI, err)
	}
	defer rd.Close()
	data, err := io.ReadAll(io.LimitReader(rd, r.Size+1))
	if err != nil {
		return ev, fmt.Errorf("claimcheck: read %s: %w", r.URI, err)
	}
	sum := sha256.Sum256(data)
	want, _ := hex.DecodeString(strings.TrimPrefix(r.Digest, "sha256:"))
	if int64(len(data)) != r.Size || !bytes.Equal(sum[:], want) {
		return ev, fmt.Errorf("%w: %s", ErrDigest, r.URI)
	}
	ev.Payload, ev.ContentType = data, r.ContentType
	return ev, nil
}
