package cdc

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/ferryhq/ferry"
)

// SlotInfo is what the database says about a CDC relay's slot, readable
// from any process (`ferry status` runs apart from the relay; in-process,
// [Relay.Status] adds the relay's own counters).
type SlotInfo struct {
	Slot string
	// Exists is false when the slot is absent (never created, or lost and
	// not yet recreated: see Recorded).
	Exists bool
	// Active is true while a relay streams from the slot; ActivePID is its
	// walsender's process id.
	Active    bool
	ActivePID int
	// ConfirmedLSN is the slot's confirmed_flush_lsn; LagBytes is
	// pg_current_wal_lsn() minus it: WAL retained for this relay.
	ConfirmedLSN string
	LagBytes     int64
	// WALStatus is pg_replication_slots.wal_status: reserved, extended,
	// unreserved (about to be lost) or lost.
	WALStatus string
	// Recorded is true when ferry_cdc_slot has a row for the slot; the
	// fields below come from it.
	Recorded      bool
	CatchUpNeeded bool
	LostCount     int
	LostAt        *time.Time
	LastError     string
}

// Inspect reads the slot's state from pg_replication_slots and the
// ferry_cdc_slot bookkeeping table (in tables' schema, or the search_path).
func Inspect(ctx context.Context, pool *pgxpool.Pool, tables ferry.Tables, slot string) (SlotInfo, error) {
	info := SlotInfo{Slot: slot}
	if err := tables.Check(); err != nil {
		return info, err
	}
	if len(slot) == 0 || len(slot) > 63 || !nameRE.MatchString(slot) {
		return info, &ferry.ConfigError{Field: "slot_name", Reason: fmt.Sprintf("must match [a-z_][a-z0-9_]* and be 1..63 bytes, got %q", slot)}
	}
	var (
		confirmed *pglogrepl.LSN
		lag       *int64
		walStatus *string
		pid       *int32
	)
	err := pool.QueryRow(ctx, `SELECT active, active_pid, confirmed_flush_lsn,
			(pg_current_wal_lsn() - confirmed_flush_lsn)::bigint, wal_status
		FROM pg_replication_slots WHERE slot_name = $1`, slot).Scan(&info.Active, &pid, &confirmed, &lag, &walStatus)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return info, fmt.Errorf("cdc: read pg_replication_slots: %w", err)
	default:
		info.Exists = true
		if pid != nil {
			info.ActivePID = int(*pid)
		}
		if confirmed != nil {
			info.ConfirmedLSN = confirmed.String()
		}
		if lag != nil {
			info.LagBytes = max(*lag, 0)
		}
		if walStatus != nil {
			info.WALStatus = *walStatus
		}
	}
	err = pool.QueryRow(ctx, fmt.Sprintf(`SELECT catchup_needed, lost_count, lost_at, last_error FROM %s WHERE slot_name = $1`,
		tables.Name("cdc_slot")), slot).Scan(&info.CatchUpNeeded, &info.LostCount, &info.LostAt, &info.LastError)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return info, fmt.Errorf("cdc: read %s: %w", tables.Name("cdc_slot"), err)
	default:
		info.Recorded = true
	}
	return info, nil
}
