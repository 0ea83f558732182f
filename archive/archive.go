package archive

import (
	"bytes"
	"context"
	"crypto/md5" //nolint:gosec // ContentMD5 is the blob stores' own integrity check, not security
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"gocloud.dev/blob"
	_ "gocloud.dev/blob/fileblob" // file:// — the embedded default
	_ "gocloud.dev/blob/memblob"  // mem:// — tests and trials
	"gocloud.dev/gcerrors"

	"github.com/ferryhq/ferry/internal/logattr"
	"github.com/ferryhq/ferry/ops"
)

// Format is the manifest's format name; a reader refuses another.
const Format = "ferry-archive/1"

// Suffixes of the two objects each confirmed batch writes.
const (
	DataSuffix     = ".ndjson.gz"
	ManifestSuffix = ".manifest.json"
)

// ErrNotConfirmed: an object was written but reading it back did not give
// the bytes written (digest or size differ); the batch's rows stay.
var ErrNotConfirmed = errors.New("archive: write not confirmed")

// Manifest describes one archived batch: one data object of
// gzip-compressed NDJSON and this JSON object beside it. It is written
// after the data object is confirmed, and cleanup deletes the rows only
// after the manifest is confirmed too.
type Manifest struct {
	Format        string              `json:"format"`
	Table         string              `json:"table"`
	Dialect       string              `json:"dialect"`
	SchemaVersion int                 `json:"schema_version"`
	FerryVersion  string              `json:"ferry_version"`
	CreatedAt     time.Time           `json:"created_at"`
	Rows          int                 `json:"rows"`
	FirstID       int64               `json:"first_id,omitempty"`
	LastID        int64               `json:"last_id,omitempty"`
	Columns       []ops.ArchiveColumn `json:"columns"`
	Object        string              `json:"object"`
	Size          int64               `json:"size"`
	SHA256        string              `json:"sha256"`
}

// Store is an archive in a blob bucket; it implements ops.Archiver. It is
// safe for concurrent use (object names carry a random part).
type Store struct {
	bucket   *blob.Bucket
	location string
	version  string
	now      func() time.Time
	owned    bool
}

var _ ops.Archiver = (*Store)(nil)

// Option configures a Store.
type Option func(*Store)

// WithFerryVersion records the writing binary's version in manifests.
func WithFerryVersion(v string) Option { return func(s *Store) { s.version = v } }

// WithClock overrides time.Now (tests).
func WithClock(now func() time.Time) Option { return func(s *Store) { s.now = now } }

// Open opens the archive at a gocloud.dev/blob URL. This package registers
// file:// (e.g. file:///var/lib/ferry/archive?create_dir=1) and mem://;
// for s3://, gs:// or azblob:// blank-import the driver in your main
// package (e.g. _ "gocloud.dev/blob/s3blob"): Ferry links no cloud SDK
// itself. A prefix=… query parameter scopes the archive to a folder.
func Open(ctx context.Context, rawURL string, opts ...Option) (*Store, error) {
	b, err := blob.OpenBucket(ctx, rawURL)
	if err != nil {
		return nil, fmt.Errorf("archive: open %s: %w", Redact(rawURL), err)
	}
	s := New(b, Redact(rawURL), opts...)
	s.owned = true
	return s, nil
}

// New returns a Store over a bucket the caller opened (and closes);
// location names it in results and audit rows.
func New(b *blob.Bucket, location string, opts ...Option) *Store {
	s := &Store{bucket: b, location: location, version: "unknown", now: time.Now}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Close closes the bucket if Open opened it.
func (s *Store) Close() error {
	if !s.owned {
		return nil
	}
	return s.bucket.Close()
}

// Location is the archive's URL as Redact shows it.
func (s *Store) Location() string { return s.location }

// Redact returns a URL fit for results, logs and audit rows: without user
// info and without query parameters (some drivers take credentials or
// tokens there) except prefix, which says where the archive is.
func Redact(raw string) string { return logattr.RedactBlobURL(raw) }

// Archive writes b as a data object and its manifest and confirms both:
// each is written with a ContentMD5 the store checks, closed, then read
// back and compared byte for byte (sha256 and size). Only a nil return
// lets cleanup delete the rows. A data object whose manifest could not be
// confirmed is removed again with that manifest (best effort; Verify
// reports a data object left over as unconfirmed, never as archived).
func (s *Store) Archive(ctx context.Context, b ops.ArchiveBatch) error {
	if len(b.Rows) == 0 {
		return nil
	}
	data, err := encodeRows(b.Columns, b.Rows)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(data)
	now := s.now().UTC()
	base := objectBase(b, now)
	m := Manifest{
		Format: Format, Table: b.Table, Dialect: string(b.Dialect), SchemaVersion: b.SchemaVersion, FerryVersion: s.version,
		CreatedAt: now, Rows: len(b.Rows), FirstID: b.FirstID, LastID: b.LastID, Columns: b.Columns,
		Object: base + DataSuffix, Size: int64(len(data)), SHA256: hex.EncodeToString(sum[:]),
	}
	if err := s.writeConfirmed(ctx, m.Object, data, "application/gzip"); err != nil {
		return err
	}
	mj, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("archive: manifest: %w", err)
	}
	if err := s.writeConfirmed(ctx, base+ManifestSuffix, append(mj, '\n'), "application/json"); err != nil {
		// The manifest may have landed although its write was not
		// confirmed: remove it first, then the data object, so what is
		// left never claims rows that were not deleted as archived.
		dctx := context.WithoutCancel(ctx)
		if derr := s.bucket.Delete(dctx, base+ManifestSuffix); derr == nil || gcerrors.Code(derr) == gcerrors.NotFound {
			_ = s.bucket.Delete(dctx, m.Object)
		}
		return err
	}
	return nil
}

// objectBase is table/<UTC time>-<first id>-<last id>-<random>: listing
// order is time order, and concurrent writers never collide.
func objectBase(b ops.ArchiveBatch, now time.Time) string {
	var r [4]byte
	_, _ = rand.Read(r[:])
	return fmt.Sprintf("%s/%s-%d-%d-%s", b.Table, now.Format("20060102T150405.000000000Z"), b.FirstID, b.LastID, hex.EncodeToString(r[:]))
}

// writeConfirmed writes data to key and returns nil only when the object
// reads back as exactly data.
func (s *Store) writeConfirmed(ctx context.Context, key string, data []byte, contentType string) error {
	m := md5.Sum(data) //nolint:gosec // see import
	w, err := s.bucket.NewWriter(ctx, key, &blob.WriterOptions{ContentType: contentType, ContentMD5: m[:]})
	if err != nil {
		return fmt.Errorf("archive: write %s: %w", key, err)
	}
	if _, err := w.Write(data); err != nil {
		_ = w.Close()
		return fmt.Errorf("archive: write %s: %w", key, err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("archive: write %s: close: %w", key, err)
	}
	back, err := s.bucket.ReadAll(ctx, key)
	if err != nil {
		return fmt.Errorf("%w: %s: read back: %v", ErrNotConfirmed, key, err)
	}
	want, got := sha256.Sum256(data), sha256.Sum256(back)
	if len(back) != len(data) || !bytes.Equal(want[:], got[:]) {
		return fmt.Errorf("%w: %s: read back %d bytes sha256 %x, wrote %d bytes sha256 %x", ErrNotConfirmed, key, len(back), got, len(data), want)
	}
	return nil
}

// isManifest reports whether key names a manifest.
func isManifest(key string) bool { return strings.HasSuffix(key, ManifestSuffix) }
