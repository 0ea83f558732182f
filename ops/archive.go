package ops

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"iter"
	"strings"

	"github.com/ferryhq/ferry/driver"
)

// Archive before delete. When CleanupOptions.Archive is set, each cleanup
// batch reads the rows it is about to delete, hands them to the Archiver,
// and deletes exactly those rows (by primary key, still matching the
// cleanup condition) only after the Archiver returned nil. The Archiver
// (package archive, over gocloud.dev/blob) lives outside ops so that
// importing ops links no blob client.

// ColumnType is how an archived column's values are typed, independent of
// the dialect, so an archive written from SQLite restores into Postgres.
type ColumnType string

// Column types. Values in an ArchiveBatch row are, per type: ColText and
// ColUUID string, ColInt int64, ColTime time.Time (UTC), ColBytes []byte;
// nil for SQL NULL (only in a Nullable column).
const (
	ColText  ColumnType = "text"
	ColUUID  ColumnType = "uuid"
	ColInt   ColumnType = "int"
	ColTime  ColumnType = "time"
	ColBytes ColumnType = "bytes"
)

// ArchiveColumn is one column of an archived table.
type ArchiveColumn struct {
	Name     string     `json:"name"`
	Type     ColumnType `json:"type"`
	Nullable bool       `json:"nullable,omitempty"`
}

// ArchiveBatch is one batch of rows that cleanup is about to delete, or
// that an archive hands back for restore.
type ArchiveBatch struct {
	Table         string          // base table name: outbox, inbox, inbox_parked, effects
	Dialect       driver.Dialect  // the database the rows came from
	SchemaVersion int             // highest applied migration there
	Columns       []ArchiveColumn // ArchiveColumns(Table)
	Rows          [][]any         // one value per column, typed as ColumnType says
	// FirstID and LastID are the smallest and largest id in Rows for the
	// tables keyed by id (outbox, inbox_parked, effects); 0 for the inbox.
	FirstID, LastID int64
}

// Archiver keeps a copy of rows before cleanup deletes them.
type Archiver interface {
	// Archive stores b durably. It returns nil only once the copy is
	// confirmed (written, closed without error and read back intact);
	// any error keeps the batch's rows in the table.
	Archive(ctx context.Context, b ArchiveBatch) error
	// Location names where the archive is (a URL without credentials),
	// recorded in the cleanup's result and audit row.
	Location() string
}

// ErrArchiveIncomplete: a cleanup batch archived rows but could delete
// none of them; cleanup stops rather than archive the same rows again.
var ErrArchiveIncomplete = errors.New("ops: archived rows were not deleted")

func col(name string, t ColumnType) ArchiveColumn { return ArchiveColumn{Name: name, Type: t} }

func ncol(name string, t ColumnType) ArchiveColumn {
	return ArchiveColumn{Name: name, Type: t, Nullable: true}
}

// archiveColumns lists every column of each table cleanup deletes from,
// in migration order (TestArchiveColumnsCoverSchema compares it with the
// installed tables, so a new migration cannot silently drop a column from
// the archive).
var archiveColumns = map[string][]ArchiveColumn{
	"outbox": {
		col("id", ColInt), col("event_id", ColUUID), col("tenant_id", ColText), col("aggregate_type", ColText),
		col("aggregate_id", ColText), col("aggregate_seq", ColInt), col("event_type", ColText), col("schema_version", ColInt),
		col("topic", ColText), col("shard", ColInt), col("shard_count", ColInt), col("content_type", ColText),
		col("payload", ColBytes), col("occurred_at", ColTime), col("created_at", ColTime), col("traceparent", ColText),
		col("correlation_id", ColText), col("causation_id", ColText), col("principal", ColText), col("action", ColText),
		col("target", ColText), col("status", ColText), col("attempts", ColInt), col("next_attempt_at", ColTime),
		col("last_error", ColText), ncol("published_at", ColTime), col("broker_receipt", ColText),
		ncol("discarded_at", ColTime), ncol("discard_audit_id", ColInt),
	},
	"inbox": {
		col("consumer", ColText), col("tenant_id", ColText), col("event_id", ColUUID), col("fingerprint", ColBytes),
		col("aggregate_type", ColText), col("aggregate_id", ColText), col("aggregate_seq", ColInt), col("event_type", ColText),
		col("applied_at", ColTime),
	},
	"inbox_parked": {
		col("id", ColInt), col("consumer", ColText), col("reason", ColText), col("park_key", ColText), col("attempts", ColInt),
		col("first_seen", ColTime), col("last_seen", ColTime), col("last_error", ColText), ncol("resolved_at", ColTime),
		col("resolution", ColText), col("tenant_id", ColText), ncol("event_id", ColUUID), col("aggregate_type", ColText),
		col("aggregate_id", ColText), col("aggregate_seq", ColInt), col("event_type", ColText), col("schema_version", ColInt),
		col("content_type", ColText), col("payload", ColBytes), ncol("occurred_at", ColTime), col("topic", ColText),
		col("traceparent", ColText), col("correlation_id", ColText), col("causation_id", ColText), col("principal", ColText),
		col("action", ColText), col("target", ColText), col("fingerprint", ColBytes), col("other_fingerprint", ColBytes),
		col("raw_destination", ColText), col("raw_key", ColText), col("raw_headers", ColText), col("raw_body", ColBytes),
		ncol("replay_requested_at", ColTime), col("replay_request", ColText), ncol("replay_audit_id", ColInt),
	},
	"effects": {
		col("id", ColInt), col("idem_key", ColText), col("consumer", ColText), col("event_id", ColUUID), col("step", ColText),
		col("tenant_id", ColText), col("target", ColText), col("operation", ColText), col("request", ColBytes),
		col("request_sha", ColBytes), col("state", ColText), col("attempts", ColInt), col("reconciliations", ColInt),
		col("next_attempt_at", ColTime), col("lease_owner", ColText), ncol("lease_until", ColTime), col("operation_id", ColText),
		col("response_summary", ColText), col("last_error", ColText), col("created_at", ColTime), col("updated_at", ColTime),
		ncol("unknown_since", ColTime), ncol("completed_at", ColTime),
	},
}

// ArchiveColumns returns the archived columns of a table cleanup deletes
// from (outbox, inbox, inbox_parked, effects), or nil for another name.
func ArchiveColumns(table string) []ArchiveColumn {
	c, ok := archiveColumns[table]
	if !ok {
		return nil
	}
	return append([]ArchiveColumn(nil), c...)
}

// ArchivedTables lists the tables an archive can hold.
func ArchivedTables() []string { return []string{"outbox", "inbox", "inbox_parked", "effects"} }

// schemaVersion is the highest applied migration (0 when unknown).
func (o *Ops) schemaVersion(ctx context.Context) int {
	var v sql.NullInt64
	if err := queryRow(ctx, o.db.Executor(), fmt.Sprintf(`SELECT max(version) FROM %s`, o.t("migrations")), nil, &v); err != nil {
		return 0
	}
	return int(v.Int64)
}

// archiveThenDelete is one cleanup batch with an archive: select up to
// opts.BatchSize of t's rows, archive them, and only once the archive is
// confirmed delete those rows by key (re-checking t.cond, so a row that
// changed meanwhile stays; its copy in the archive is then a spare that
// restore skips). It returns the rows deleted and the rows selected.
func (o *Ops) archiveThenDelete(ctx context.Context, t cleanupTarget, opts CleanupOptions, schema int) (deleted, selected int64, err error) {
	cols := archiveColumns[t.table]
	if cols == nil {
		return 0, 0, errors.New("no archive column list for this table")
	}
	b := ArchiveBatch{Table: t.table, Dialect: o.db.Dialect(), SchemaVersion: schema, Columns: cols}
	if err := o.readArchiveBatch(ctx, t, opts.BatchSize, &b); err != nil {
		return 0, 0, err
	}
	if len(b.Rows) == 0 {
		return 0, 0, nil
	}
	if err := opts.Archive.Archive(ctx, b); err != nil {
		return 0, int64(len(b.Rows)), fmt.Errorf("archive of %d rows not confirmed, nothing deleted: %w", len(b.Rows), err)
	}
	q, args := o.archivedDelete(t, b)
	n, err := o.db.Executor().Exec(ctx, q, args...)
	if err != nil {
		return 0, int64(len(b.Rows)), fmt.Errorf("delete archived rows: %w", err)
	}
	if n == 0 {
		return 0, int64(len(b.Rows)), fmt.Errorf("%w: %d rows archived to %s, none deleted (they changed meanwhile?)", ErrArchiveIncomplete, len(b.Rows), opts.Archive.Location())
	}
	return n, int64(len(b.Rows)), nil
}

// keyColumns are t's primary-key columns.
func (t cleanupTarget) keyColumns() []string {
	sel := t.sel
	if sel == "" {
		sel = t.key
	}
	parts := strings.Split(strings.Trim(sel, "()"), ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// readArchiveBatch selects up to n of t's eligible rows, every column
// typed as archiveColumns says, ordered by key.
func (o *Ops) readArchiveBatch(ctx context.Context, t cleanupTarget, n int, b *ArchiveBatch) error {
	sel := make([]string, len(b.Columns))
	for i, c := range b.Columns {
		sel[i] = c.Name
		if c.Type == ColUUID {
			sel[i] = o.uuidText(c.Name)
		}
	}
	q := fmt.Sprintf(`SELECT %s FROM %s WHERE %s ORDER BY %s LIMIT %d`,
		strings.Join(sel, ", "), o.t(t.table), t.cond, strings.Join(t.keyColumns(), ", "), n)
	rows, err := o.db.Executor().Query(ctx, q, t.args...)
	if err != nil {
		return fmt.Errorf("read rows to archive: %w", err)
	}
	defer rows.Close()
	idIdx := -1
	for i, c := range b.Columns {
		if c.Name == "id" {
			idIdx = i
		}
	}
	for rows.Next() {
		dest := make([]any, len(b.Columns))
		for i, c := range b.Columns {
			switch c.Type {
			case ColText, ColUUID:
				dest[i] = new(sql.NullString)
			case ColInt:
				dest[i] = new(sql.NullInt64)
			case ColTime:
				dest[i] = new(nullTime)
			case ColBytes:
				dest[i] = new([]byte)
			}
		}
		if err := rows.Scan(dest...); err != nil {
			return fmt.Errorf("read rows to archive: %w", err)
		}
		row := make([]any, len(dest))
		for i, d := range dest {
			switch v := d.(type) {
			case *sql.NullString:
				if v.Valid {
					row[i] = v.String
				}
			case *sql.NullInt64:
				if v.Valid {
					row[i] = v.Int64
				}
			case *nullTime:
				if v.Valid {
					row[i] = v.Time
				}
			case *[]byte:
				row[i] = append([]byte{}, *v...)
			}
		}
		if idIdx >= 0 {
			if id, ok := row[idIdx].(int64); ok {
				if b.FirstID == 0 || id < b.FirstID {
					b.FirstID = id
				}
				b.LastID = max(b.LastID, id)
			}
		}
		b.Rows = append(b.Rows, row)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read rows to archive: %w", err)
	}
	return nil
}

// archivedDelete deletes exactly b's rows (by t's key) that still match
// t.cond.
func (o *Ops) archivedDelete(t cleanupTarget, b ArchiveBatch) (string, []any) {
	keys := t.keyColumns()
	idx := make([]int, len(keys))
	for k, name := range keys {
		for i, c := range b.Columns {
			if c.Name == name {
				idx[k] = i
			}
		}
	}
	args := append([]any(nil), t.args...)
	tuples := make([]string, len(b.Rows))
	for r, row := range b.Rows {
		ph := make([]string, len(keys))
		for k := range keys {
			args = append(args, row[idx[k]])
			ph[k] = fmt.Sprintf("$%d", len(args))
		}
		tuples[r] = strings.Join(ph, ", ")
		if len(keys) > 1 {
			tuples[r] = "(" + tuples[r] + ")"
		}
	}
	var in string
	switch {
	case len(keys) == 1:
		in = keys[0] + " IN (" + strings.Join(tuples, ", ") + ")"
	case o.sqlite():
		// SQLite takes a row value IN only with a subquery on the right.
		in = "(" + strings.Join(keys, ", ") + ") IN (VALUES " + strings.Join(tuples, ", ") + ")"
	default:
		// Postgres and MySQL: a list of row constructors; Postgres infers
		// each placeholder's type from the key column (uuid for event_id).
		in = "(" + strings.Join(keys, ", ") + ") IN (" + strings.Join(tuples, ", ") + ")"
	}
	return fmt.Sprintf(`DELETE FROM %s WHERE (%s) AND %s`, o.t(t.table), t.cond, in), args
}

// RestoreResult counts what RestoreArchive read and wrote.
type RestoreResult struct {
	DryRun   bool   `json:"dry_run"`
	Location string `json:"location"`
	Objects  int    `json:"objects"`
	Rows     int64  `json:"rows"`
	// Inserted rows were absent from the target and written; Present rows
	// were already there (same primary or unique key) and left untouched,
	// which is what makes a second restore a no-op.
	Inserted int64            `json:"inserted"`
	Present  int64            `json:"present"`
	ByTable  map[string]int64 `json:"by_table"`
	AuditID  int64            `json:"audit_id,omitempty"`
}

// restoreChunk bounds the rows of one INSERT (placeholders stay well under
// every dialect's limit).
const restoreChunk = 100

// RestoreArchive writes archived rows back into Ferry's tables in this
// database, with their original ids and values: outbox rows come back as
// they were deleted (sent, so the relay does not publish them again; a
// replay is a separate, explicit action). A row whose primary or unique
// key is already present is skipped, so restoring twice inserts nothing
// the second time. Each batch is one transaction.
//
// Without a.Approve it only counts the archived rows. An approved run
// writes one audit row ("archive.restore") naming location and totals.
func (o *Ops) RestoreArchive(ctx context.Context, src iter.Seq2[ArchiveBatch, error], location string, a Approval) (RestoreResult, error) {
	if err := a.check(); err != nil {
		return RestoreResult{}, err
	}
	res := RestoreResult{DryRun: !a.Approve, Location: location, ByTable: map[string]int64{}}
	for b, err := range src {
		if err != nil {
			return res, err
		}
		want := archiveColumns[b.Table]
		if want == nil {
			return res, &ArgError{Field: "archive table", Reason: fmt.Sprintf("%q is not a table cleanup archives (want one of %s)", b.Table, strings.Join(ArchivedTables(), ", "))}
		}
		if err := sameColumns(b.Columns, want); err != nil {
			return res, fmt.Errorf("ops: restore %s: %w", b.Table, err)
		}
		res.Objects++
		res.Rows += int64(len(b.Rows))
		res.ByTable[b.Table] += int64(len(b.Rows))
		if !a.Approve {
			continue
		}
		var n int64
		err := o.inTx(ctx, func(tx driver.Tx) error {
			var err error
			n, err = o.insertArchived(ctx, tx, b)
			return err
		})
		if err != nil {
			return res, err
		}
		res.Inserted += n
		res.Present += int64(len(b.Rows)) - n
	}
	if !a.Approve {
		return res, nil
	}
	actx := context.WithoutCancel(ctx)
	err := o.inTx(actx, func(tx driver.Tx) error {
		id, err := o.writeAudit(actx, tx, "archive.restore", a, res, nil, res.Inserted)
		res.AuditID = id
		return err
	})
	return res, err
}

// sameColumns checks an archive's column list against this binary's.
func sameColumns(got, want []ArchiveColumn) error {
	if len(got) != len(want) {
		return fmt.Errorf("archive has %d columns, this Ferry expects %d (archived by another schema version?)", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Errorf("archive column %d is %s %s, this Ferry expects %s %s", i, got[i].Name, got[i].Type, want[i].Name, want[i].Type)
		}
	}
	return nil
}

// insertArchived inserts b's rows, skipping rows whose keys exist, and
// returns how many were inserted.
func (o *Ops) insertArchived(ctx context.Context, tx driver.Tx, b ArchiveBatch) (int64, error) {
	names := make([]string, len(b.Columns))
	hasID := false
	for i, c := range b.Columns {
		names[i] = c.Name
		hasID = hasID || c.Name == "id"
	}
	var total int64
	for start := 0; start < len(b.Rows); start += restoreChunk {
		chunk := b.Rows[start:min(start+restoreChunk, len(b.Rows))]
		var args []any
		tuples := make([]string, len(chunk))
		for r, row := range chunk {
			ph := make([]string, len(row))
			for i, v := range row {
				args = append(args, v)
				ph[i] = fmt.Sprintf("$%d", len(args))
			}
			tuples[r] = "(" + strings.Join(ph, ", ") + ")"
		}
		tail := " ON CONFLICT DO NOTHING"
		override := ""
		switch {
		case o.mysql():
			// Not INSERT IGNORE: that would also turn a bad value into a
			// warning. A no-op update counts 0 affected rows.
			tail = fmt.Sprintf(" ON DUPLICATE KEY UPDATE %[1]s = %[1]s", names[0])
		case o.pg() && hasID:
			override = " OVERRIDING SYSTEM VALUE" // ids are GENERATED ALWAYS AS IDENTITY
		}
		q := fmt.Sprintf(`INSERT INTO %s (%s)%s VALUES %s%s`, o.t(b.Table), strings.Join(names, ", "), override, strings.Join(tuples, ", "), tail)
		n, err := tx.Exec(ctx, q, args...)
		if err != nil {
			return total, fmt.Errorf("ops: restore %s: %w", b.Table, err)
		}
		total += n
	}
	if o.pg() && hasID && total > 0 {
		// Explicit ids do not move an identity's sequence: move it past
		// them, or the next producer insert would collide with a restored id.
		if _, err := tx.Exec(ctx, fmt.Sprintf(`SELECT setval(pg_get_serial_sequence($1, 'id'), GREATEST(nextval(pg_get_serial_sequence($1, 'id')), (SELECT max(id) FROM %s)))`, o.t(b.Table)),
			o.t(b.Table)); err != nil {
			return total, fmt.Errorf("ops: restore %s: advance id sequence: %w", b.Table, err)
		}
	}
	return total, nil
}
