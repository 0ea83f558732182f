package archive

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"strings"

	"gocloud.dev/gcerrors"

	"github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/ops"
)

// ErrVerifyFailed: Verify found a missing, corrupted or inconsistent
// object; see Report.Problems.
var ErrVerifyFailed = errors.New("archive: verification failed")

// Problem kinds in a Report.
const (
	ProblemMissing     = "missing"     // the manifest names an object that is not there
	ProblemDigest      = "digest"      // the object's sha256 or size differs from the manifest
	ProblemCount       = "count"       // the object holds another number of rows than the manifest says
	ProblemIDRange     = "id_range"    // an id lies outside the manifest's range
	ProblemUnreadable  = "unreadable"  // the manifest or the object does not decode
	ProblemUnconfirmed = "unconfirmed" // a data object without a manifest (its rows were not deleted)
)

// Problem is one thing Verify found wrong.
type Problem struct {
	Kind     string `json:"kind"`
	Manifest string `json:"manifest,omitempty"`
	Object   string `json:"object,omitempty"`
	Detail   string `json:"detail"`
}

// Report is what Verify read.
type Report struct {
	Location  string           `json:"location"`
	Manifests int              `json:"manifests"`
	Verified  int              `json:"verified"`
	Rows      int64            `json:"rows"`
	ByTable   map[string]int64 `json:"by_table"`
	Problems  []Problem        `json:"problems,omitempty"`
	// Unconfirmed data objects are warnings, not failures: the batch they
	// belong to was never confirmed, so its rows were not deleted.
	Unconfirmed []string `json:"unconfirmed,omitempty"`
}

// OK reports whether every manifest's object was read back intact.
func (r Report) OK() bool { return len(r.Problems) == 0 }

// Verify re-reads every manifest and the object it names, and checks the
// object's size and sha256, that it decodes, that it holds the manifest's
// row count, and that every id lies in the manifest's range. It returns
// the report and, when anything is wrong, an error wrapping
// ErrVerifyFailed; data objects without a manifest are listed as
// unconfirmed (their rows were never deleted) without failing.
func (s *Store) Verify(ctx context.Context) (Report, error) {
	rep := Report{Location: s.location, ByTable: map[string]int64{}}
	manifests, data, err := s.list(ctx)
	if err != nil {
		return rep, err
	}
	named := map[string]bool{}
	for _, key := range manifests {
		rep.Manifests++
		m, err := s.readManifest(ctx, key)
		if err != nil {
			rep.Problems = append(rep.Problems, Problem{Kind: ProblemUnreadable, Manifest: key, Detail: err.Error()})
			continue
		}
		named[m.Object] = true
		b, p := s.readBatch(ctx, key, m)
		if p != nil {
			rep.Problems = append(rep.Problems, *p)
			continue
		}
		rep.Verified++
		rep.Rows += int64(len(b.Rows))
		rep.ByTable[m.Table] += int64(len(b.Rows))
	}
	for _, key := range data {
		if !named[key] {
			rep.Unconfirmed = append(rep.Unconfirmed, key)
		}
	}
	if len(rep.Problems) > 0 {
		p := rep.Problems[0]
		name := p.Object
		if name == "" {
			name = p.Manifest
		}
		return rep, fmt.Errorf("%w: %d of %d objects at %s: first: %s %s: %s", ErrVerifyFailed, len(rep.Problems), rep.Manifests,
			s.location, p.Kind, name, p.Detail)
	}
	return rep, nil
}

// Batches yields every archived batch in listing (time) order, each
// verified as Verify does; the first problem ends it with an error
// wrapping ErrVerifyFailed, so restore never writes a corrupted row.
func (s *Store) Batches(ctx context.Context) iter.Seq2[ops.ArchiveBatch, error] {
	return func(yield func(ops.ArchiveBatch, error) bool) {
		manifests, _, err := s.list(ctx)
		if err != nil {
			yield(ops.ArchiveBatch{}, err)
			return
		}
		for _, key := range manifests {
			m, err := s.readManifest(ctx, key)
			if err != nil {
				yield(ops.ArchiveBatch{}, fmt.Errorf("%w: %s: %v", ErrVerifyFailed, key, err))
				return
			}
			b, p := s.readBatch(ctx, key, m)
			if p != nil {
				yield(ops.ArchiveBatch{}, fmt.Errorf("%w: %s %s: %s", ErrVerifyFailed, p.Kind, p.Object, p.Detail))
				return
			}
			if !yield(b, nil) {
				return
			}
		}
	}
}

// list returns the manifest and data object keys, in listing order.
func (s *Store) list(ctx context.Context) (manifests, data []string, err error) {
	it := s.bucket.List(nil)
	for {
		obj, err := it.Next(ctx)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("archive: list %s: %w", s.location, err)
		}
		switch {
		case isManifest(obj.Key):
			manifests = append(manifests, obj.Key)
		case strings.HasSuffix(obj.Key, DataSuffix):
			data = append(data, obj.Key)
		}
	}
	return manifests, data, nil
}

func (s *Store) readManifest(ctx context.Context, key string) (Manifest, error) {
	raw, err := s.bucket.ReadAll(ctx, key)
	if err != nil {
		return Manifest{}, fmt.Errorf("read manifest: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(raw, &m); err != nil {
		return Manifest{}, fmt.Errorf("decode manifest: %w", err)
	}
	if m.Format != Format {
		return Manifest{}, fmt.Errorf("manifest format %q, want %q", m.Format, Format)
	}
	if want := ops.ArchiveColumns(m.Table); want == nil {
		return Manifest{}, fmt.Errorf("manifest table %q is not one cleanup archives", m.Table)
	}
	return m, nil
}

// readBatch reads and checks m's object.
func (s *Store) readBatch(ctx context.Context, key string, m Manifest) (ops.ArchiveBatch, *Problem) {
	data, err := s.bucket.ReadAll(ctx, m.Object)
	if gcerrors.Code(err) == gcerrors.NotFound {
		return ops.ArchiveBatch{}, &Problem{Kind: ProblemMissing, Manifest: key, Object: m.Object, Detail: fmt.Sprintf("object named by the manifest (%d rows) is not in the archive", m.Rows)}
	}
	if err != nil {
		return ops.ArchiveBatch{}, &Problem{Kind: ProblemUnreadable, Manifest: key, Object: m.Object, Detail: err.Error()}
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != m.SHA256 || int64(len(data)) != m.Size {
		return ops.ArchiveBatch{}, &Problem{Kind: ProblemDigest, Manifest: key, Object: m.Object,
			Detail: fmt.Sprintf("sha256 %s size %d, manifest says sha256 %s size %d", got, len(data), m.SHA256, m.Size)}
	}
	rows, err := decodeRows(m.Columns, data)
	if err != nil {
		return ops.ArchiveBatch{}, &Problem{Kind: ProblemUnreadable, Manifest: key, Object: m.Object, Detail: err.Error()}
	}
	if len(rows) != m.Rows {
		return ops.ArchiveBatch{}, &Problem{Kind: ProblemCount, Manifest: key, Object: m.Object, Detail: fmt.Sprintf("%d rows, manifest says %d", len(rows), m.Rows)}
	}
	b := ops.ArchiveBatch{Table: m.Table, Dialect: driver.Dialect(m.Dialect), SchemaVersion: m.SchemaVersion, Columns: m.Columns,
		Rows: rows, FirstID: m.FirstID, LastID: m.LastID}
	for i, c := range m.Columns {
		if c.Name != "id" {
			continue
		}
		for _, r := range rows {
			if id, _ := r[i].(int64); id < m.FirstID || id > m.LastID {
				return ops.ArchiveBatch{}, &Problem{Kind: ProblemIDRange, Manifest: key, Object: m.Object, Detail: fmt.Sprintf("id %d outside %d..%d", id, m.FirstID, m.LastID)}
			}
		}
	}
	return b, nil
}
