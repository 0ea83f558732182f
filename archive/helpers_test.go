package archive_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"gocloud.dev/blob"
	"gocloud.dev/blob/driver"
	"gocloud.dev/gcerrors"

	"github.com/ferryhq/ferry"
	fdriver "github.com/ferryhq/ferry/driver"
	"github.com/ferryhq/ferry/driver/mysql"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/ops"
	"github.com/ferryhq/ferry/outbox"
)

// env is one migrated database with an outbox writer and Ops over it.
type env struct {
	name   string
	db     ops.DB
	exec   fdriver.Executor
	ops    *ops.Ops
	insert func(t *testing.T, evs ...ferry.Event) []ferry.Event
}

var tables = ferry.Tables{}

func tn(base string) string { return tables.Name(base) }

func setup[TTx any](t *testing.T, name string, drv fdriver.Driver[TTx]) *env {
	t.Helper()
	ctx := context.Background()
	if _, err := migrate.Up(ctx, drv, tables); err != nil {
		t.Fatalf("migrate up: %v", err)
	}
	w, err := outbox.New(drv, outbox.WithShardCount(4))
	if err != nil {
		t.Fatal(err)
	}
	db := any(drv).(ops.DB)
	o, err := ops.New(db, ops.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	return &env{name: name, db: db, exec: drv.Executor(), ops: o, insert: func(t *testing.T, evs ...ferry.Event) []ferry.Event {
		t.Helper()
		out, err := w.Insert(ctx, evs...)
		if err != nil {
			t.Fatalf("outbox insert: %v", err)
		}
		return out
	}}
}

func newSQLite(t *testing.T) *env {
	db, _ := testenv.NewSQLite(t)
	return setup(t, "sqlite", sqlite.New(db))
}

func newPostgres(t *testing.T) *env {
	s := testenv.NewPostgresSchema(t)
	return setup(t, "postgres", pgxv5.New(s.Pool))
}

func newMySQL(t *testing.T) *env {
	d := testenv.NewMySQLDatabase(t)
	return setup(t, "mysql", mysql.New(d.DB))
}

// dialects runs fn on SQLite, Postgres and MySQL/MariaDB (each skips with
// a reason when its server is missing).
func dialects(t *testing.T, fn func(t *testing.T, newEnv func(t *testing.T) *env)) {
	t.Run("sqlite", func(t *testing.T) { fn(t, newSQLite) })
	t.Run("postgres", func(t *testing.T) { fn(t, newPostgres) })
	t.Run("mysql", func(t *testing.T) { fn(t, newMySQL) })
}

func mustExec(t *testing.T, e *env, q string, args ...any) int64 {
	t.Helper()
	n, err := e.exec.Exec(context.Background(), q, args...)
	if err != nil {
		t.Fatalf("exec %q: %v", q, err)
	}
	return n
}

func count(t *testing.T, e *env, table string) int64 {
	t.Helper()
	var n int64
	if _, err := fdriver.QueryRow(context.Background(), e.exec, fmt.Sprintf(`SELECT count(*) FROM %s`, tn(table)), nil, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

const retention = 240 * time.Hour // above the default 168h inbox replay horizon

var approve = ops.Approval{Approve: true, Actor: "test", Reason: "archive test"}

// seeded counts what seed wrote that cleanup will remove.
type seeded struct{ outbox, inbox, parked, effects int64 }

func (s seeded) total() int64 { return s.outbox + s.inbox + s.parked + s.effects }

// seed writes old rows in every table cleanup archives, plus rows it must
// keep (recent sent, pending, open parked, pending effect).
func seed(t *testing.T, e *env) seeded {
	t.Helper()
	old := time.Now().Add(-300 * time.Hour).UTC()
	var evs []ferry.Event
	for i := range 25 {
		evs = append(evs, ferry.Event{TenantID: "acme", AggregateType: "order", AggregateID: fmt.Sprint("o-", i%4), EventType: "order.created",
			SchemaVersion: 1, Payload: []byte(fmt.Sprintf(`{"n":%d,"name":"ünïcødé \u0000"}`, i)), Headers: ferry.Headers{CorrelationID: fmt.Sprint("c-", i)}})
	}
	evs = e.insert(t, evs...)
	for i, ev := range evs[:23] {
		mustExec(t, e, fmt.Sprintf(`UPDATE %s SET status = 'sent', published_at = $1, broker_receipt = $2, attempts = 1 WHERE event_id = $3`, tn("outbox")),
			old.Add(time.Duration(i)*time.Millisecond), fmt.Sprintf(`{"seq":%d}`, i), ev.ID.String())
	}
	mustExec(t, e, fmt.Sprintf(`UPDATE %s SET status = 'sent', published_at = $1 WHERE event_id = $2`, tn("outbox")), time.Now().UTC(), evs[23].ID.String())
	for i, ev := range evs[:7] {
		mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`, tn("inbox")), fmt.Sprint("billing-", i%2), "acme", ev.ID.String(), []byte{0, 1, byte(i), 0xff},
			"order", ev.AggregateID, ev.AggregateSeq, ev.EventType, old)
	}
	mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (consumer, tenant_id, event_id, fingerprint, aggregate_type, aggregate_id, aggregate_seq, event_type, applied_at)
VALUES ('billing-0', 'acme', $1, $2, 'order', 'o-0', 1, 'order.created', $3)`, tn("inbox")), evs[24].ID.String(), []byte{9}, time.Now().UTC())
	for i := range 3 {
		resolved := any(old)
		if i == 2 {
			resolved = nil // open: kept
		}
		mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (consumer, reason, park_key, first_seen, last_seen, resolved_at, resolution, event_id, payload, raw_body)
VALUES ($1, 'poison', $2, $3, $3, $4, $5, $6, $7, $8)`, tn("inbox_parked")), "billing-0", fmt.Sprint("k-", i), old, resolved, "discarded",
			evs[i].ID.String(), []byte(`{"bad":true}`), []byte{})
	}
	for i := range 4 {
		state, completed := "succeeded", any(old)
		if i == 3 {
			state, completed = "pending", nil
		}
		mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (idem_key, consumer, event_id, step, target, operation, request, request_sha, state, next_attempt_at, created_at, updated_at, completed_at)
VALUES ($1, 'billing-0', $2, 'charge', 'psp', 'charge', $3, $4, $5, $6, $6, $6, $7)`, tn("effects")), fmt.Sprint("idem-", i), evs[i].ID.String(),
			[]byte(`{"amount":1}`), []byte{1, 2, 3}, state, old, completed)
	}
	return seeded{outbox: 23, inbox: 7, parked: 2, effects: 3}
}

// dump renders every archived column of table's rows in key order, in a
// form that is the same on every dialect (times in UTC to the
// microsecond, which all three keep).
func dump(t *testing.T, e *env, table string) string {
	t.Helper()
	cols := ops.ArchiveColumns(table)
	sel := make([]string, len(cols))
	for i, c := range cols {
		sel[i] = c.Name
		if c.Type == ops.ColUUID && e.db.Dialect() == fdriver.Postgres {
			sel[i] += "::text"
		}
	}
	order := "id"
	if table == "inbox" {
		order = "consumer, tenant_id, event_id"
	}
	rows, err := e.exec.Query(context.Background(), fmt.Sprintf(`SELECT %s FROM %s ORDER BY %s`, strings.Join(sel, ", "), tn(table), order))
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		dest := make([]any, len(cols))
		for i, c := range cols {
			switch c.Type {
			case ops.ColText, ops.ColUUID, ops.ColTime:
				dest[i] = new(sql.NullString)
			case ops.ColInt:
				dest[i] = new(sql.NullInt64)
			case ops.ColBytes:
				dest[i] = new([]byte)
			}
			if c.Type == ops.ColTime {
				dest[i] = new(anyTime)
			}
		}
		if err := rows.Scan(dest...); err != nil {
			t.Fatal(err)
		}
		for i, d := range dest {
			fmt.Fprintf(&b, "%s=", cols[i].Name)
			switch v := d.(type) {
			case *sql.NullString:
				fmt.Fprintf(&b, "%q ", v.String)
			case *sql.NullInt64:
				fmt.Fprintf(&b, "%v/%d ", v.Valid, v.Int64)
			case *[]byte:
				fmt.Fprintf(&b, "%x ", *v)
			case *anyTime:
				fmt.Fprintf(&b, "%s ", v.s)
			}
		}
		b.WriteString("\n")
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// anyTime scans a time column of any dialect into a UTC microsecond string.
type anyTime struct{ s string }

func (a *anyTime) Scan(src any) error {
	switch v := src.(type) {
	case nil:
		a.s = "NULL"
		return nil
	case time.Time:
		a.s = v.UTC().Truncate(time.Microsecond).Format(time.RFC3339Nano)
		return nil
	case []byte:
		return a.Scan(string(v))
	case string:
		for _, l := range []string{"2006-01-02 15:04:05.999999999-07:00", "2006-01-02 15:04:05.999999999Z07:00", time.RFC3339Nano, "2006-01-02 15:04:05.999999999"} {
			if t, err := time.Parse(l, v); err == nil {
				return a.Scan(t)
			}
		}
	}
	return fmt.Errorf("anyTime: %T %v", src, src)
}

func dumpAll(t *testing.T, e *env) string {
	var b strings.Builder
	for _, tb := range ops.ArchivedTables() {
		b.WriteString("== " + tb + "\n" + dump(t, e, tb))
	}
	return b.String()
}

// faultyBucket is a gocloud.dev/blob driver over a real bucket (memblob or
// fileblob) that misbehaves on write as told: failClose(key) makes the
// writer's Close return an error after the inner object was written (the
// store got the bytes, the writer could not confirm), corrupt(key) flips a
// byte on the way in (Close succeeds; only reading back can tell).
type faultyBucket struct {
	inner     *blob.Bucket
	failClose func(key string) bool
	corrupt   func(key string) bool
}

func newFaulty(inner *blob.Bucket, failClose, corrupt func(string) bool) *blob.Bucket {
	none := func(string) bool { return false }
	if failClose == nil {
		failClose = none
	}
	if corrupt == nil {
		corrupt = none
	}
	return blob.NewBucket(&faultyBucket{inner: inner, failClose: failClose, corrupt: corrupt})
}

type faultyWriter struct {
	w       *blob.Writer
	fail    bool
	corrupt bool
	n       int
}

func (w *faultyWriter) Write(p []byte) (int, error) {
	if w.corrupt && w.n == 0 && len(p) > 10 {
		q := append([]byte(nil), p...)
		q[10] ^= 0xff
		p = q
	}
	w.n += len(p)
	return w.w.Write(p)
}

func (w *faultyWriter) Close() error {
	err := w.w.Close()
	if w.fail {
		return fmt.Errorf("injected: close failed after upload")
	}
	return err
}

func (f *faultyBucket) NewTypedWriter(ctx context.Context, key, contentType string, _ *driver.WriterOptions) (driver.Writer, error) {
	w, err := f.inner.NewWriter(ctx, key, &blob.WriterOptions{ContentType: contentType})
	if err != nil {
		return nil, err
	}
	return &faultyWriter{w: w, fail: f.failClose(key), corrupt: f.corrupt(key)}, nil
}

type faultyReader struct{ r *blob.Reader }

func (r faultyReader) Read(p []byte) (int, error) { return r.r.Read(p) }
func (r faultyReader) Close() error               { return r.r.Close() }
func (r faultyReader) As(any) bool                { return false }
func (r faultyReader) Attributes() *driver.ReaderAttributes {
	return &driver.ReaderAttributes{ContentType: r.r.ContentType(), ModTime: r.r.ModTime(), Size: r.r.Size()}
}

func (f *faultyBucket) NewRangeReader(ctx context.Context, key string, offset, length int64, _ *driver.ReaderOptions) (driver.Reader, error) {
	r, err := f.inner.NewRangeReader(ctx, key, offset, length, nil)
	if err != nil {
		return nil, err
	}
	return faultyReader{r}, nil
}

func (f *faultyBucket) ListPaged(ctx context.Context, opts *driver.ListOptions) (*driver.ListPage, error) {
	token := opts.PageToken
	if token == nil {
		token = blob.FirstPageToken
	}
	objs, next, err := f.inner.ListPage(ctx, token, max(opts.PageSize, 1000), &blob.ListOptions{Prefix: opts.Prefix, Delimiter: opts.Delimiter})
	if err != nil && err != io.EOF {
		return nil, err
	}
	page := &driver.ListPage{NextPageToken: next}
	for _, o := range objs {
		page.Objects = append(page.Objects, &driver.ListObject{Key: o.Key, ModTime: o.ModTime, Size: o.Size, MD5: o.MD5, IsDir: o.IsDir})
	}
	return page, nil
}

func (f *faultyBucket) Attributes(ctx context.Context, key string) (*driver.Attributes, error) {
	a, err := f.inner.Attributes(ctx, key)
	if err != nil {
		return nil, err
	}
	return &driver.Attributes{ContentType: a.ContentType, ModTime: a.ModTime, Size: a.Size, MD5: a.MD5, ETag: a.ETag}, nil
}

func (f *faultyBucket) ErrorCode(err error) gcerrors.ErrorCode { return gcerrors.Code(err) }
func (f *faultyBucket) As(any) bool                            { return false }
func (f *faultyBucket) ErrorAs(error, any) bool                { return false }
func (f *faultyBucket) Copy(ctx context.Context, dst, src string, _ *driver.CopyOptions) error {
	return f.inner.Copy(ctx, dst, src, nil)
}
func (f *faultyBucket) Delete(ctx context.Context, key string, _ *driver.DeleteOptions) error {
	return f.inner.Delete(ctx, key)
}
func (f *faultyBucket) SignedURL(context.Context, string, *driver.SignedURLOptions) (string, error) {
	return "", fmt.Errorf("not supported")
}
func (f *faultyBucket) Close() error { return nil }
