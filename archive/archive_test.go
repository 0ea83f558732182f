package archive_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gocloud.dev/blob/memblob"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/archive"
	fdriver "github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/ops"
)

func openDir(t *testing.T, dir string) *archive.Store {
	t.Helper()
	s, err := archive.Open(context.Background(), "file://"+dir+"?create_dir=1", archive.WithFerryVersion("test"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func cleanupWith(e *env, a ops.Archiver) (ops.CleanupResult, error) {
	return e.ops.Cleanup(context.Background(), ops.CleanupOptions{Retention: retention, BatchSize: 5, Archive: a}, approve)
}

// lineDiff returns the lines of a not in b, keeping "==" table headers.
func lineDiff(a, b string) string {
	have := map[string]bool{}
	for _, l := range strings.Split(b, "\n") {
		have[l] = true
	}
	var out []string
	for _, l := range strings.Split(a, "\n") {
		if strings.HasPrefix(l, "==") || !have[l] {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestArchiveRoundTrip(t *testing.T) {
	dialects(t, func(t *testing.T, newEnv func(t *testing.T) *env) {
		ctx := context.Background()
		e := newEnv(t)
		want := seed(t, e)
		before := dumpAll(t, e)
		dir := t.TempDir()
		st := openDir(t, dir)

		res, err := cleanupWith(e, st)
		if err != nil {
			t.Fatal(err)
		}
		if res.Outbox != want.outbox || res.Inbox != want.inbox || res.ResolvedParked != want.parked || res.Effects != want.effects || res.Archived != want.total() {
			t.Fatalf("cleanup %+v, want %+v", res, want)
		}
		if !strings.HasPrefix(res.ArchiveLocation, "file://") {
			t.Errorf("archive location %q", res.ArchiveLocation)
		}
		for tb, n := range map[string]int64{"outbox": 2, "inbox": 1, "inbox_parked": 1, "effects": 1} {
			if got := count(t, e, tb); got != n {
				t.Errorf("%s: %d rows left, want %d", tb, got, n)
			}
		}
		afterCleanup := dumpAll(t, e)

		// The manifest says what the object holds; check one by hand.
		ms, _ := filepath.Glob(filepath.Join(dir, "outbox", "*"+archive.ManifestSuffix))
		if len(ms) != 5 { // 23 rows in batches of 5
			t.Fatalf("%d outbox manifests, want 5", len(ms))
		}
		raw, err := os.ReadFile(ms[0])
		if err != nil {
			t.Fatal(err)
		}
		var m archive.Manifest
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		obj, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(m.Object)))
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(obj)
		if m.Table != "outbox" || m.Rows != 5 || m.Dialect != string(e.db.Dialect()) || m.SchemaVersion < 9 || m.FerryVersion != "test" ||
			m.FirstID < 1 || m.LastID-m.FirstID < 4 || m.SHA256 != hex.EncodeToString(sum[:]) || m.Size != int64(len(obj)) || m.CreatedAt.IsZero() {
			t.Fatalf("manifest %+v (object sha256 %x, %d bytes)", m, sum, len(obj))
		}

		rep, err := st.Verify(ctx)
		if err != nil || !rep.OK() || rep.Manifests != 9 || rep.Verified != 9 || rep.Rows != want.total() || rep.ByTable["inbox"] != want.inbox || len(rep.Unconfirmed) != 0 {
			t.Fatalf("verify %+v %v", rep, err)
		}

		// Restore into a fresh database of the same dialect and, for
		// SQLite's archive, into Postgres too: exactly the deleted rows.
		deleted := lineDiff(before, afterCleanup)
		intoFresh := func(t *testing.T, scratch *env) {
			rr, err := scratch.ops.RestoreArchive(ctx, st.Batches(ctx), st.Location(), approve)
			if err != nil || rr.Inserted != want.total() || rr.Present != 0 || rr.AuditID == 0 {
				t.Fatalf("restore into a fresh %s database: %+v %v", scratch.name, rr, err)
			}
			if got := dumpAll(t, scratch); strings.TrimSpace(got) != strings.TrimSpace(deleted) {
				t.Fatalf("restored rows in %s differ from the deleted ones:\n%s", scratch.name, firstDiff(got, deleted))
			}
			// The identity moved past the restored ids: a new event inserts.
			scratch.insert(t, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: "new", EventType: "order.created", SchemaVersion: 1, Payload: []byte(`{}`)})
		}
		intoFresh(t, newEnv(t))
		if e.name == "sqlite" {
			t.Run("into postgres", func(t *testing.T) { intoFresh(t, newPostgres(t)) })
		}

		// Dry run: counts only.
		dry, err := e.ops.RestoreArchive(ctx, st.Batches(ctx), st.Location(), ops.Approval{})
		if err != nil || !dry.DryRun || dry.Rows != want.total() || dry.Inserted != 0 || dumpAll(t, e) != afterCleanup {
			t.Fatalf("dry run %+v %v", dry, err)
		}
		// Into the original database: back as it was; twice is a no-op.
		for i, wantIns := range []int64{want.total(), 0} {
			rr, err := e.ops.RestoreArchive(ctx, st.Batches(ctx), st.Location(), approve)
			if err != nil || rr.Inserted != wantIns || rr.Present != want.total()-wantIns || rr.Objects != 9 {
				t.Fatalf("restore #%d: %+v %v", i+1, rr, err)
			}
			if got := dumpAll(t, e); got != before {
				t.Fatalf("restore #%d: tables differ from before the cleanup:\n%s", i+1, firstDiff(got, before))
			}
		}
	})
}

// firstDiff shows the first line where got and want differ.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(g), len(w)) {
		var a, b string
		if i < len(g) {
			a = g[i]
		}
		if i < len(w) {
			b = w[i]
		}
		if a != b {
			return fmt.Sprintf("line %d:\n got %s\nwant %s", i+1, a, b)
		}
	}
	return "(equal)"
}

func TestCleanupDeletesNothingWhenArchiveNotConfirmed(t *testing.T) {
	isData := func(k string) bool { return strings.HasSuffix(k, archive.DataSuffix) }
	isManifest := func(k string) bool { return strings.HasSuffix(k, archive.ManifestSuffix) }
	cases := []struct {
		name             string
		failClose, flips func(string) bool
		wantErr          error
	}{
		{"close fails on the data object", isData, nil, nil},
		{"close fails on the manifest", isManifest, nil, nil},
		{"data object corrupted on the way in", nil, isData, archive.ErrNotConfirmed},
	}
	for _, d := range []struct {
		name string
		mk   func(*testing.T) *env
	}{{"sqlite", newSQLite}, {"postgres", newPostgres}} {
		t.Run(d.name, func(t *testing.T) {
			for _, c := range cases {
				t.Run(c.name, func(t *testing.T) {
					ctx := context.Background()
					e := d.mk(t)
					seed(t, e)
					before := dumpAll(t, e)
					inner := memblob.OpenBucket(nil)
					defer inner.Close()
					st := archive.New(newFaulty(inner, c.failClose, c.flips), "mem://faulty")
					res, err := cleanupWith(e, st)
					if err == nil || (c.wantErr != nil && !errors.Is(err, c.wantErr)) || !strings.Contains(err.Error(), "nothing deleted") {
						t.Fatalf("cleanup: %+v, err %v", res, err)
					}
					if res.Outbox != 0 || res.Archived != 0 || dumpAll(t, e) != before {
						t.Fatalf("rows were deleted although their archive was not confirmed: %+v", res)
					}
					// Nothing counts as archived, and a data object whose
					// manifest failed was removed again.
					rep, err := st.Verify(ctx)
					if err != nil || rep.Rows != 0 {
						t.Errorf("verify after the failed cleanup: %+v %v", rep, err)
					}
					if c.failClose != nil && c.failClose("x"+archive.ManifestSuffix) && len(rep.Unconfirmed) != 0 {
						t.Errorf("data object left behind its failed manifest: %v", rep.Unconfirmed)
					}
				})
			}
			// Negative control: an archiver that deletes without waiting for
			// the confirmation loses the rows (the object is corrupt, nothing
			// can bring them back).
			t.Run("negative control: not waiting for confirmation loses rows", func(t *testing.T) {
				ctx := context.Background()
				e := d.mk(t)
				want := seed(t, e)
				inner := memblob.OpenBucket(nil)
				defer inner.Close()
				st := archive.New(newFaulty(inner, nil, isData), "mem://faulty")
				res, err := cleanupWith(e, unconfirmed{st})
				if err != nil || res.Outbox != want.outbox {
					t.Fatalf("cleanup %+v %v", res, err)
				}
				// Nothing confirmed reached the archive: verify finds no
				// archived row, restore brings none back.
				rep, err := st.Verify(ctx)
				if err != nil || rep.Rows != 0 || len(rep.Unconfirmed) == 0 {
					t.Fatalf("verify of the unconfirmed archive: %+v %v", rep, err)
				}
				rr, err := e.ops.RestoreArchive(ctx, st.Batches(ctx), st.Location(), approve)
				if err != nil || rr.Inserted != 0 || count(t, e, "outbox") != 2 {
					t.Fatalf("restore %+v %v: the rows should be lost", rr, err)
				}
			})
		})
	}
}

// unconfirmed archives but reports success whatever happened: the bug the
// confirmation prevents.
type unconfirmed struct{ *archive.Store }

func (u unconfirmed) Archive(ctx context.Context, b ops.ArchiveBatch) error {
	_ = u.Store.Archive(ctx, b)
	return nil
}

func TestVerifyDetectsCorruptAndMissingObjects(t *testing.T) {
	ctx := context.Background()
	e := newSQLite(t)
	want := seed(t, e)
	dir := t.TempDir()
	st := openDir(t, dir)
	if _, err := cleanupWith(e, st); err != nil {
		t.Fatal(err)
	}
	data, _ := filepath.Glob(filepath.Join(dir, "outbox", "*"+archive.DataSuffix))
	slices.Sort(data)
	if len(data) != 5 {
		t.Fatalf("%d data objects", len(data))
	}
	// Flip one byte of one object, remove another, leave a stray one.
	b, err := os.ReadFile(data[1])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x01
	if err := os.WriteFile(data[1], b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(data[3]); err != nil {
		t.Fatal(err)
	}
	stray := filepath.Join(dir, "outbox", "stray"+archive.DataSuffix)
	if err := os.WriteFile(stray, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	rep, err := st.Verify(ctx)
	if !errors.Is(err, archive.ErrVerifyFailed) || rep.OK() || len(rep.Problems) != 2 || rep.Verified != 7 {
		t.Fatalf("verify: %+v %v", rep, err)
	}
	kinds := map[string]string{}
	for _, p := range rep.Problems {
		kinds[p.Kind] = p.Object
	}
	rel := func(p string) string { r, _ := filepath.Rel(dir, p); return filepath.ToSlash(r) }
	if kinds[archive.ProblemDigest] != rel(data[1]) || kinds[archive.ProblemMissing] != rel(data[3]) {
		t.Fatalf("problems %+v, want digest on %s and missing %s", rep.Problems, rel(data[1]), rel(data[3]))
	}
	if len(rep.Unconfirmed) != 1 || rep.Unconfirmed[0] != "outbox/stray"+archive.DataSuffix {
		t.Errorf("unconfirmed %v", rep.Unconfirmed)
	}
	if rep.Rows != want.total()-10 {
		t.Errorf("verified rows %d, want %d", rep.Rows, want.total()-10)
	}
	// Restore refuses the corrupt object.
	if _, err := e.ops.RestoreArchive(ctx, st.Batches(ctx), st.Location(), approve); !errors.Is(err, archive.ErrVerifyFailed) {
		t.Fatalf("restore of a corrupt archive: %v", err)
	}
	// Control: the untouched archive of the same cleanup verified (above,
	// in TestArchiveRoundTrip); here, restoring the object put back fixes it.
	if err := os.Remove(stray); err != nil {
		t.Fatal(err)
	}
}

// The archive's column lists are the installed tables' columns: a new
// migration cannot silently leave a column out of the archive.
func TestArchiveColumnsCoverSchema(t *testing.T) {
	dialects(t, func(t *testing.T, newEnv func(t *testing.T) *env) {
		e := newEnv(t)
		for _, tb := range ops.ArchivedTables() {
			var q string
			switch e.db.Dialect() {
			case fdriver.SQLite:
				q = fmt.Sprintf(`SELECT name FROM pragma_table_info('%s')`, tables.Bare(tb))
			case fdriver.MySQL:
				q = fmt.Sprintf(`SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE() AND table_name = '%s' AND extra NOT LIKE '%%GENERATED%%'`, tables.Bare(tb))
			default:
				q = fmt.Sprintf(`SELECT column_name FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = '%s'`, tables.Bare(tb))
			}
			rows, err := e.exec.Query(context.Background(), q)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for rows.Next() {
				var n string
				if err := rows.Scan(&n); err != nil {
					t.Fatal(err)
				}
				got = append(got, n)
			}
			rows.Close()
			var want []string
			for _, c := range ops.ArchiveColumns(tb) {
				want = append(want, c.Name)
			}
			slices.Sort(got)
			slices.Sort(want)
			if !slices.Equal(got, want) {
				t.Errorf("%s: installed columns %v, archived %v", tb, got, want)
			}
		}
	})
}

func TestRedactKeepsNoCredentials(t *testing.T) {
	for in, want := range map[string]string{
		"s3://user:secret@bucket?region=eu-west-1&prefix=ferry%2F&sas_token=abc": "s3://bucket?prefix=ferry%2F",
		"file:///var/lib/ferry/archive?create_dir=1":                             "file:///var/lib/ferry/archive",
		"azblob://container?sas_token=abc":                                       "azblob://container",
	} {
		if got := archive.Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
