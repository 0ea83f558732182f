package statebench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/migrate"
)

// The designs measured. Each has its own tables (prefix) except
// COPYState, which marks into StateTable's tables.
const (
	StatusUpdate = "a_status_update" // today: UPDATE status, in partial-index predicates
	HOTMark      = "b_hot_mark"      // UPDATE of a column no index references
	HOTMarkFF50  = "b_hot_mark_ff50" // the same on a fillfactor=50 outbox
	StateTable   = "c_state_table"   // INSERT (id, published_at, receipt) into a narrow logged table
	Watermark    = "d_watermark"     // one UPDATE per shard per batch + exceptions table
	COPYState    = "e_copy_state"    // COPY into c's narrow table
	receiptBytes = 24                // like a JetStream "STREAM:seq" receipt
	shardCount   = ferry.DefaultShardCount
)

// Variants is every design, in the order reported.
var Variants = []string{StatusUpdate, HOTMark, HOTMarkFF50, StateTable, Watermark, COPYState}

// Config is one run.
type Config struct {
	Marked     int // rows already marked when the claim is measured
	Batch      int // events per mark statement
	Batches    int // mark statements per variant per round
	Rounds     int
	Payload    int
	Aggregates int
	Variants   []string // default Variants
	Progress   io.Writer
}

// Result is one design's figures: medians over rounds.
type Result struct {
	Variant string `json:"variant"`
	// Mark: WAL from EXPLAIN (ANALYZE, WAL) of the mark statement (exact,
	// this statement only; COPY cannot be EXPLAINed, so e has none);
	// LSNBytes is pg_current_wal_insert_lsn() across the mark transaction
	// (cluster-wide: other sessions' WAL counts too).
	WALBytes   float64 `json:"mark_wal_bytes_per_event"`
	WALRecords float64 `json:"mark_wal_records_per_event"`
	WALFPI     float64 `json:"mark_wal_fpi_per_event"`
	LSNBytes   float64 `json:"mark_lsn_bytes_per_event"`
	MicrosPer  float64 `json:"mark_us_per_event"`
	// InsertWAL is the producer's side: WAL per event of inserting the
	// round's rows into this design's outbox (its index set).
	InsertWAL float64 `json:"insert_wal_bytes_per_event"`
	// HOTShare is n_tup_hot_upd / n_tup_upd on the outbox over the run
	// (designs that update the event row).
	HOTShare *float64 `json:"hot_share,omitempty"`
	// The claim with Marked rows marked: plain and with a per-shard cursor
	// (the relay's in-memory "lowest unsent id"), where the design has one.
	Claim       Explain  `json:"claim"`
	ClaimCursor *Explain `json:"claim_cursor,omitempty"`
	Rounds      []Round  `json:"rounds"`
}

// Round is one round's figures for one design.
type Round struct {
	WALBytes, WALRecords, WALFPI, LSNBytes, MicrosPer, InsertWAL float64
	Load                                                         string
}

// Explain is one EXPLAIN (ANALYZE, BUFFERS): the median execution of 3,
// or the first when it took over a second.
type Explain struct {
	ExecutionMS float64 `json:"execution_ms"`
	SharedHit   int64   `json:"shared_hit_blocks"`
	SharedRead  int64   `json:"shared_read_blocks"`
	Rows        int64   `json:"rows"`
	// JITMS is the part of ExecutionMS spent compiling (jit = on and the
	// plan's estimated cost over jit_above_cost).
	JITMS float64 `json:"jit_ms"`
}

type design struct {
	name   string
	t      ferry.Tables
	sent   string // c: the narrow table; d: the exceptions table
	wm     string // d: the watermark table
	claim  string // ($1 int[] shards, $2 per-shard limit)
	cursor string // ($1 jsonb [{shard, after}], $2 limit)
	lastID int64  // highest id inserted so far
}

func prefixOf(v string) string {
	return "sb_" + strings.SplitN(v, "_", 2)[0] + strconv.Itoa(len(v)) + "_"
}

// Run measures cfg.Variants on pool, whose search_path is a scratch schema
// the caller drops afterwards.
func Run(ctx context.Context, pool *pgxpool.Pool, cfg Config) ([]Result, error) {
	if cfg.Batch < 1 || cfg.Batches < 2 || cfg.Rounds < 1 || cfg.Marked < 0 || cfg.Aggregates < 1 || cfg.Payload < 2 {
		return nil, fmt.Errorf("statebench: batch >= 1, batches >= 2, rounds >= 1, marked >= 0, aggregates >= 1, payload >= 2 (got %+v)", cfg)
	}
	if len(cfg.Variants) == 0 {
		cfg.Variants = Variants
	}
	logf := func(format string, args ...any) {
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, format+"\n", args...)
		}
	}
	per := (cfg.Batch + shardCount - 1) / shardCount
	designs := map[string]*design{}
	for _, v := range cfg.Variants {
		if v == COPYState {
			continue // shares StateTable's tables
		}
		if !knownVariant(v) {
			return nil, fmt.Errorf("statebench: unknown variant %q (known: %s)", v, strings.Join(Variants, ", "))
		}
		t0 := time.Now()
		d, err := setup(ctx, pool, v, cfg, per)
		if err != nil {
			return nil, err
		}
		designs[v] = d
		logf("setup %-18s %d marked + %d pending rows in %.1fs", v, cfg.Marked, 4*cfg.Batch, time.Since(t0).Seconds())
	}
	if contains(cfg.Variants, COPYState) {
		if designs[StateTable] == nil {
			d, err := setup(ctx, pool, StateTable, cfg, per)
			if err != nil {
				return nil, err
			}
			designs[StateTable] = d
		}
		designs[COPYState] = designs[StateTable]
	}
	results := map[string]*Result{}
	for _, v := range cfg.Variants {
		r := &Result{Variant: v}
		results[v] = r
		d := designs[v]
		if v == COPYState && results[StateTable] != nil {
			r.Claim, r.ClaimCursor = results[StateTable].Claim, results[StateTable].ClaimCursor // the same tables
			continue
		}
		var err error
		if r.Claim, err = explainMedian(ctx, pool, d.claim, allShards(), per); err != nil {
			return nil, fmt.Errorf("statebench: %s claim: %w", v, err)
		}
		if d.cursor != "" {
			cur, err := cursors(ctx, pool, d)
			if err != nil {
				return nil, err
			}
			e, err := explainMedian(ctx, pool, d.cursor, cur, per)
			if err != nil {
				return nil, fmt.Errorf("statebench: %s cursor claim: %w", v, err)
			}
			r.ClaimCursor = &e
		}
	}
	stats0, err := tableStats(ctx, pool)
	if err != nil {
		return nil, err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	for round := 0; round < cfg.Rounds; round++ {
		order := append([]string(nil), cfg.Variants...)
		// Interleave: rotate the order every round.
		k := round % len(order)
		order = append(order[k:], order[:k]...)
		for _, v := range order {
			rr, err := markRound(ctx, conn.Conn(), pool, designs[v], v, round, cfg)
			if err != nil {
				conn.Release()
				return nil, fmt.Errorf("statebench: %s round %d: %w", v, round+1, err)
			}
			rr.Load = loadAvg()
			results[v].Rounds = append(results[v].Rounds, rr)
			logf("round %d %-18s mark %6.1f µs/event, WAL %6.0f B/event (%.3f FPI), lsn %6.0f B/event, insert WAL %5.0f B/event, load %s",
				round+1, v, rr.MicrosPer, rr.WALBytes, rr.WALFPI, rr.LSNBytes, rr.InsertWAL, rr.Load)
		}
	}
	// Close the measuring backend so its table statistics are reported.
	_ = conn.Conn().Close(ctx)
	conn.Release()
	time.Sleep(1500 * time.Millisecond)
	stats1, err := tableStats(ctx, pool)
	if err != nil {
		return nil, err
	}
	out := make([]Result, 0, len(cfg.Variants))
	for _, v := range cfg.Variants {
		r := results[v]
		med := func(f func(Round) float64) float64 {
			xs := make([]float64, len(r.Rounds))
			for i, x := range r.Rounds {
				xs[i] = f(x)
			}
			return median(xs)
		}
		r.WALBytes = med(func(x Round) float64 { return x.WALBytes })
		r.WALRecords = med(func(x Round) float64 { return x.WALRecords })
		r.WALFPI = med(func(x Round) float64 { return x.WALFPI })
		r.LSNBytes = med(func(x Round) float64 { return x.LSNBytes })
		r.MicrosPer = med(func(x Round) float64 { return x.MicrosPer })
		r.InsertWAL = med(func(x Round) float64 { return x.InsertWAL })
		if v == StatusUpdate || v == HOTMark || v == HOTMarkFF50 {
			name := designs[v].t.Bare("outbox")
			a, b := stats1[name], stats0[name]
			if upd := a[0] - b[0]; upd > 0 {
				share := float64(a[1]-b[1]) / float64(upd)
				r.HOTShare = &share
			}
		}
		out = append(out, *r)
	}
	return out, nil
}

func knownVariant(v string) bool { return contains(Variants, v) }

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

func allShards() []int32 {
	s := make([]int32, shardCount)
	for i := range s {
		s[i] = int32(i)
	}
	return s
}

// setup builds one design's tables with Ferry's migrations, adapts them
// and fills them: cfg.Marked marked rows, then 4 batches of pending rows
// for the claim to find.
func setup(ctx context.Context, pool *pgxpool.Pool, v string, cfg Config, per int) (*design, error) {
	d := &design{name: v, t: ferry.Tables{Prefix: prefixOf(v)}}
	if _, err := migrate.Up(ctx, pgxv5.New(pool), d.t); err != nil {
		return nil, fmt.Errorf("statebench: %s: migrate: %w", v, err)
	}
	ob := d.t.Name("outbox")
	exec := func(sql string) error {
		if _, err := pool.Exec(ctx, sql); err != nil {
			return fmt.Errorf("statebench: %s: %s: %w", v, firstLine(sql), err)
		}
		return nil
	}
	fill := Fill{Topic: "bench.order", Marked: cfg.Marked, Pending: 4 * cfg.Batch, Aggregates: cfg.Aggregates, PayloadBytes: cfg.Payload}
	cols := "o.*"
	lateral := func(where string) string {
		return fmt.Sprintf(`SELECT %s FROM unnest($1::int[]) AS s(shard) CROSS JOIN LATERAL (
    SELECT * FROM %s o WHERE o.shard = s.shard AND %s ORDER BY o.id LIMIT $2) o`, cols, ob, where)
	}
	cursor := func(where string) string {
		return fmt.Sprintf(`SELECT %s FROM jsonb_to_recordset($1::jsonb) AS c(shard int, after bigint) CROSS JOIN LATERAL (
    SELECT * FROM %s o WHERE o.shard = c.shard AND o.id > c.after AND %s ORDER BY o.id LIMIT $2) o`, cols, ob, where)
	}
	if v == StatusUpdate {
		fill.MarkedStatus = true
		d.claim = lateral("o.status = 'pending' AND o.next_attempt_at <= now()")
	} else {
		// State out of the row: the status-predicate indexes go (status
		// never changes), the claim reads (shard, id).
		rows, err := pool.Query(ctx, `SELECT indexname FROM pg_indexes WHERE schemaname = current_schema() AND tablename = $1 AND indexdef LIKE '%status%'`, d.t.Bare("outbox"))
		if err != nil {
			return nil, err
		}
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, err
		}
		for _, n := range names {
			if err := exec("DROP INDEX " + pgQuote(n)); err != nil {
				return nil, err
			}
		}
		if err := exec(fmt.Sprintf("CREATE INDEX %s ON %s (shard, id)", d.t.Ident("outbox_shard_id_idx"), ob)); err != nil {
			return nil, err
		}
	}
	switch v {
	case HOTMark, HOTMarkFF50:
		if err := exec("ALTER TABLE " + ob + " ADD COLUMN relay_sent_at timestamptz"); err != nil {
			return nil, err
		}
		if v == HOTMarkFF50 {
			if err := exec("ALTER TABLE " + ob + " SET (fillfactor = 50)"); err != nil {
				return nil, err
			}
		}
		fill.MarkedColumn = "relay_sent_at"
		d.claim = lateral("o.relay_sent_at IS NULL")
		d.cursor = cursor("o.relay_sent_at IS NULL")
	case StateTable:
		d.sent = d.t.Name("outbox_sent")
		if err := exec(fmt.Sprintf(`CREATE TABLE %s (id bigint PRIMARY KEY, published_at timestamptz NOT NULL DEFAULT now(), receipt text NOT NULL DEFAULT '')`, d.sent)); err != nil {
			return nil, err
		}
		notSent := fmt.Sprintf("NOT EXISTS (SELECT 1 FROM %s x WHERE x.id = o.id)", d.sent)
		d.claim, d.cursor = lateral(notSent), cursor(notSent)
	case Watermark:
		d.wm, d.sent = d.t.Name("relay_watermark"), d.t.Name("relay_exceptions")
		if err := exec(fmt.Sprintf(`CREATE TABLE %s (shard integer PRIMARY KEY, sent_upto bigint NOT NULL DEFAULT 0)`, d.wm)); err != nil {
			return nil, err
		}
		if err := exec(fmt.Sprintf(`CREATE TABLE %s (id bigint PRIMARY KEY, shard integer NOT NULL, status text NOT NULL,
    attempts integer NOT NULL DEFAULT 0, next_attempt_at timestamptz NOT NULL DEFAULT now(), last_error text NOT NULL DEFAULT '')`, d.sent)); err != nil {
			return nil, err
		}
		// The watermark row is the shard's cursor: no plain/cursor split.
		d.claim = fmt.Sprintf(`SELECT %s FROM unnest($1::int[]) AS s(shard) JOIN %s w ON w.shard = s.shard CROSS JOIN LATERAL (
    SELECT * FROM %s o WHERE o.shard = w.shard AND o.id > w.sent_upto
      AND NOT EXISTS (SELECT 1 FROM %s x WHERE x.id = o.id) ORDER BY o.id LIMIT $2) o`, cols, d.wm, ob, d.sent)
	}
	if err := Prefill(ctx, pool, d.t, fill); err != nil {
		return nil, err
	}
	switch v {
	case StateTable:
		if err := exec(fmt.Sprintf(`INSERT INTO %s (id, receipt) SELECT id, 'bench' FROM %s WHERE id <= %d`, d.sent, ob, cfg.Marked)); err != nil {
			return nil, err
		}
	case Watermark:
		if err := exec(fmt.Sprintf(`INSERT INTO %s (shard, sent_upto) SELECT s, COALESCE((SELECT max(id) FROM %s WHERE shard = s AND id <= %d), 0)
FROM generate_series(0, %d) s`, d.wm, ob, cfg.Marked, shardCount-1)); err != nil {
			return nil, err
		}
	}
	for _, tbl := range []string{ob, d.sent, d.wm} {
		if tbl != "" {
			if err := exec("VACUUM (ANALYZE) " + tbl); err != nil {
				return nil, err
			}
		}
	}
	if err := pool.QueryRow(ctx, "SELECT max(id) FROM "+ob).Scan(&d.lastID); err != nil {
		return nil, err
	}
	return d, nil
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// cursors is the per-shard "lowest unsent id - 1" a relay would keep in
// memory: here the highest marked id of each shard.
func cursors(ctx context.Context, pool *pgxpool.Pool, d *design) (string, error) {
	var cur string
	where := "relay_sent_at IS NOT NULL"
	if d.name == StateTable {
		where = fmt.Sprintf("EXISTS (SELECT 1 FROM %s x WHERE x.id = o.id)", d.sent)
	}
	err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT jsonb_agg(jsonb_build_object('shard', s, 'after',
    COALESCE((SELECT max(o.id) FROM %s o WHERE o.shard = s AND %s), 0))) FROM generate_series(0, %d) s`,
		d.t.Name("outbox"), where, shardCount-1)).Scan(&cur)
	return cur, err
}

// markRound inserts cfg.Batches batches of new rows (the producer's part,
// WAL measured), then marks them batch by batch as the relay would:
// even batches under EXPLAIN (ANALYZE, WAL) for the WAL figures, odd
// batches plain for the time.
func markRound(ctx context.Context, conn *pgx.Conn, pool *pgxpool.Pool, d *design, v string, round int, cfg Config) (Round, error) {
	n := cfg.Batches * cfg.Batch
	ob := d.t.Name("outbox")
	var rr Round
	// The producer's rows for this round, on their own aggregates.
	fill := Fill{Topic: "bench.order", Pending: n, Aggregates: cfg.Aggregates, PayloadBytes: cfg.Payload,
		AggregatePrefix: fmt.Sprintf("r%d%s-", round, v[:1])}
	isql, iargs, err := fill.insert(d.t)
	if err != nil {
		return rr, err
	}
	var raw []byte
	if err := conn.QueryRow(ctx, "EXPLAIN (ANALYZE, WAL, TIMING OFF, FORMAT JSON) "+isql, iargs...).Scan(&raw); err != nil {
		return rr, fmt.Errorf("insert: %w", err)
	}
	ins, err := parseWAL(raw)
	if err != nil {
		return rr, err
	}
	if err := fillSequences(ctx, conn, d.t, fill.prefix()); err != nil {
		return rr, err
	}
	rr.InsertWAL = float64(ins.bytes) / float64(n)
	rows, err := conn.Query(ctx, "SELECT id, shard FROM "+ob+" WHERE id > $1 ORDER BY id", d.lastID)
	if err != nil {
		return rr, err
	}
	type idShard struct{ id, shard int64 }
	var ids []idShard
	for rows.Next() {
		var x idShard
		if err := rows.Scan(&x.id, &x.shard); err != nil {
			rows.Close()
			return rr, err
		}
		ids = append(ids, x)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return rr, err
	}
	if len(ids) != n {
		return rr, fmt.Errorf("inserted %d rows, want %d", len(ids), n)
	}
	d.lastID = ids[len(ids)-1].id
	receipt := strings.Repeat("r", receiptBytes)
	var walB, walR, walF, lsnB, walEvents, timeEvents float64
	var elapsed time.Duration
	for b := 0; b < cfg.Batches; b++ {
		batch := ids[b*cfg.Batch : (b+1)*cfg.Batch]
		var sql string
		var args []any
		var copyRows [][]any
		switch v {
		case StatusUpdate, HOTMark, HOTMarkFF50, StateTable:
			type m struct {
				ID      int64  `json:"id"`
				Receipt string `json:"receipt"`
			}
			ms := make([]m, len(batch))
			for i, x := range batch {
				ms[i] = m{x.id, receipt}
			}
			js, _ := json.Marshal(ms)
			args = []any{string(js)}
			from := "jsonb_to_recordset($1::jsonb) AS m(id bigint, receipt text)"
			switch v {
			case StatusUpdate:
				sql = fmt.Sprintf(`UPDATE %[1]s SET status = 'sent', published_at = now(), broker_receipt = m.receipt FROM %[2]s
WHERE %[1]s.id = m.id AND %[1]s.status = 'pending'`, ob, from)
			case HOTMark, HOTMarkFF50:
				sql = fmt.Sprintf(`UPDATE %[1]s SET relay_sent_at = now(), broker_receipt = m.receipt FROM %[2]s
WHERE %[1]s.id = m.id AND %[1]s.relay_sent_at IS NULL`, ob, from)
			case StateTable:
				sql = fmt.Sprintf(`INSERT INTO %s (id, published_at, receipt) SELECT m.id, now(), m.receipt FROM %s ON CONFLICT (id) DO NOTHING`, d.sent, from)
			}
		case Watermark:
			upto := map[int64]int64{}
			for _, x := range batch {
				upto[x.shard] = max(upto[x.shard], x.id)
			}
			type m struct {
				Shard int64 `json:"shard"`
				Upto  int64 `json:"upto"`
			}
			var ms []m
			for s, u := range upto {
				ms = append(ms, m{s, u})
			}
			sort.Slice(ms, func(i, j int) bool { return ms[i].Shard < ms[j].Shard }) // lock order
			js, _ := json.Marshal(ms)
			args = []any{string(js)}
			sql = fmt.Sprintf(`UPDATE %[1]s w SET sent_upto = m.upto FROM jsonb_to_recordset($1::jsonb) AS m(shard int, upto bigint)
WHERE w.shard = m.shard AND w.sent_upto < m.upto`, d.wm)
		case COPYState:
			now := time.Now()
			copyRows = make([][]any, len(batch))
			for i, x := range batch {
				copyRows[i] = []any{x.id, now, receipt}
			}
		}
		explain := b%2 == 0 && v != COPYState
		var lsn0, lsn1 string
		if err := conn.QueryRow(ctx, "SELECT pg_current_wal_insert_lsn()::text").Scan(&lsn0); err != nil {
			return rr, err
		}
		t0 := time.Now()
		tx, err := conn.Begin(ctx)
		if err != nil {
			return rr, err
		}
		var w walUse
		err = func() error {
			if _, err := tx.Exec(ctx, "SET LOCAL synchronous_commit = off"); err != nil {
				return err
			}
			switch {
			case v == COPYState:
				got, err := tx.CopyFrom(ctx, pgx.Identifier{d.t.Bare("outbox_sent")}, []string{"id", "published_at", "receipt"}, pgx.CopyFromRows(copyRows))
				if err == nil && got != int64(len(batch)) {
					err = fmt.Errorf("copied %d rows, want %d", got, len(batch))
				}
				return err
			case explain:
				var raw []byte
				if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, WAL, TIMING OFF, FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
					return err
				}
				w, err = parseWAL(raw)
				return err
			default:
				tag, err := tx.Exec(ctx, sql, args...)
				if err == nil && v != Watermark && tag.RowsAffected() != int64(len(batch)) {
					err = fmt.Errorf("marked %d rows, want %d", tag.RowsAffected(), len(batch))
				}
				return err
			}
		}()
		if err != nil {
			_ = tx.Rollback(ctx)
			return rr, err
		}
		if err := tx.Commit(ctx); err != nil {
			return rr, err
		}
		dt := time.Since(t0)
		if err := conn.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::text", lsn0).Scan(&lsn1); err != nil {
			return rr, err
		}
		lb, _ := strconv.ParseFloat(lsn1, 64)
		lsnB += lb
		if explain {
			walB, walR, walF, walEvents = walB+float64(w.bytes), walR+float64(w.records), walF+float64(w.fpi), walEvents+float64(len(batch))
		} else {
			elapsed += dt
			timeEvents += float64(len(batch))
		}
	}
	if err := checkMarked(ctx, conn, d, v, ids[0].id, d.lastID, n); err != nil {
		return rr, err
	}
	if walEvents > 0 {
		rr.WALBytes, rr.WALRecords, rr.WALFPI = walB/walEvents, walR/walEvents, walF/walEvents
	}
	rr.LSNBytes = lsnB / float64(n)
	rr.MicrosPer = float64(elapsed/time.Nanosecond) / 1e3 / timeEvents
	return rr, nil
}

type walUse struct{ bytes, records, fpi int64 }

func parseWAL(raw []byte) (walUse, error) {
	var plans []struct {
		Plan struct {
			Records int64 `json:"WAL Records"`
			FPI     int64 `json:"WAL FPI"`
			Bytes   int64 `json:"WAL Bytes"`
		} `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &plans); err != nil || len(plans) != 1 {
		return walUse{}, fmt.Errorf("unexpected EXPLAIN output: %v", err)
	}
	p := plans[0].Plan
	return walUse{bytes: p.Bytes, records: p.Records, fpi: p.FPI}, nil
}

func explainMedian(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) (Explain, error) {
	var runs []Explain
	for i := 0; i < 3; i++ {
		if i == 1 && runs[0].ExecutionMS > 1000 {
			return runs[0], nil // a slow plan once is enough: it is the finding
		}
		var raw []byte
		if err := pool.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
			return Explain{}, err
		}
		var plans []struct {
			Plan struct {
				Rows int64 `json:"Actual Rows"`
				Hit  int64 `json:"Shared Hit Blocks"`
				Read int64 `json:"Shared Read Blocks"`
			} `json:"Plan"`
			Execution float64 `json:"Execution Time"`
			JIT       struct {
				Timing struct {
					Total float64 `json:"Total"`
				} `json:"Timing"`
			} `json:"JIT"`
		}
		if err := json.Unmarshal(raw, &plans); err != nil || len(plans) != 1 {
			return Explain{}, fmt.Errorf("unexpected EXPLAIN output: %v", err)
		}
		p := plans[0]
		runs = append(runs, Explain{ExecutionMS: p.Execution, SharedHit: p.Plan.Hit, SharedRead: p.Plan.Read, Rows: p.Plan.Rows, JITMS: p.JIT.Timing.Total})
	}
	sort.Slice(runs, func(i, j int) bool { return runs[i].ExecutionMS < runs[j].ExecutionMS })
	return runs[1], nil
}

// tableStats: n_tup_upd, n_tup_hot_upd per table of the current schema.
func tableStats(ctx context.Context, pool *pgxpool.Pool) (map[string][2]int64, error) {
	rows, err := pool.Query(ctx, `SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = current_schema()`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string][2]int64{}
	for rows.Next() {
		var n string
		var v [2]int64
		if err := rows.Scan(&n, &v[0], &v[1]); err != nil {
			return nil, err
		}
		out[n] = v
	}
	return out, rows.Err()
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// checkMarked verifies that every row of the round's id range [lo, hi] is
// marked in design v's terms.
func checkMarked(ctx context.Context, conn *pgx.Conn, d *design, v string, lo, hi int64, n int) error {
	ob := d.t.Name("outbox")
	var q string
	switch v {
	case StatusUpdate:
		q = "SELECT count(*) FROM " + ob + " WHERE id BETWEEN $1 AND $2 AND status = 'sent'"
	case HOTMark, HOTMarkFF50:
		q = "SELECT count(*) FROM " + ob + " WHERE id BETWEEN $1 AND $2 AND relay_sent_at IS NOT NULL"
	case StateTable, COPYState:
		q = "SELECT count(*) FROM " + d.sent + " WHERE id BETWEEN $1 AND $2"
	case Watermark:
		q = fmt.Sprintf("SELECT count(*) FROM %s o JOIN %s w ON w.shard = o.shard WHERE o.id BETWEEN $1 AND $2 AND o.id <= w.sent_upto", ob, d.wm)
	}
	var got int
	if err := conn.QueryRow(ctx, q, lo, hi).Scan(&got); err != nil {
		return err
	}
	if got != n {
		return fmt.Errorf("%d of the round's %d rows marked", got, n)
	}
	return nil
}
