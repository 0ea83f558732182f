package ops_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/ferryhq/ferry/migrate"
	"github.com/ferryhq/ferry/ops"
)

// gatherOps scrapes a Collector over e once and returns its series as
// "name{l="v",...}" -> value.
func gatherOps(t *testing.T, e *env) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(ops.NewCollector(e.ops))
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			out[seriesName(f.GetName(), m)] = m.GetGauge().GetValue()
		}
	}
	return out
}

func seriesName(name string, m *dto.Metric) string {
	var ls []string
	for _, l := range m.GetLabel() {
		ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	if len(ls) == 0 {
		return name
	}
	return name + "{" + strings.Join(ls, ",") + "}"
}

func section(t *testing.T, st ops.Status, name string) ops.SectionStatus {
	t.Helper()
	for _, s := range st.Sections {
		if s.Name == name {
			return s
		}
	}
	t.Fatalf("no section %s in %+v", name, st.Sections)
	return ops.SectionStatus{}
}

// A table that should exist and is missing or unreadable never reads as
// zero: Status fails that section (naming the table or the error) and
// returns ErrStatusIncomplete with the rest, and the Collector exports
// ferry_ops_up 0, ferry_ops_section_up{section} 0 and none of the
// section's own gauges (which would read "nothing parked, no gaps").
func TestStatusMissingTableIsNotZero(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		evs := e.insert(t, event("1", "order.created"))
		mustExec(t, e, fmt.Sprintf(`INSERT INTO %s (consumer, reason, park_key, first_seen, last_seen, tenant_id, aggregate_type, aggregate_id, aggregate_seq)
VALUES ('billing', 'gap', 'k1', $1, $1, 'acme', 'order', '9', 3)`, tn("inbox_parked")), evs[0].OccurredAt.UTC())
		st, err := e.ops.Status(ctx)
		if err != nil {
			t.Fatalf("healthy status: %v", err)
		}
		for _, s := range st.Sections {
			if s.State != ops.SectionOK || !s.Required {
				t.Errorf("healthy database: section %+v", s)
			}
		}
		m := gatherOps(t, e)
		if m["ferry_ops_up"] != 1 || m[`ferry_ops_section_up{section="inbox"}`] != 1 || m[`ferry_ops_inbox_open_gaps{consumer="billing"}`] != 1 {
			t.Fatalf("healthy metrics: %v", m)
		}

		// The inbox's parked table is dropped: the parked and gap numbers are
		// unknown, not zero.
		mustExec(t, e, "DROP TABLE "+tn("inbox_parked"))
		st, err = e.ops.Status(ctx)
		var se *ops.StatusError
		if !errors.Is(err, ops.ErrStatusIncomplete) || !errors.As(err, &se) || len(se.Failed) != 1 || se.Failed[0].Name != ops.SectionInbox {
			t.Fatalf("status with ferry_inbox_parked dropped: err %v", err)
		}
		if !strings.Contains(err.Error(), "section inbox failed: table ferry_inbox_parked missing (migration 0003_inbox is recorded as applied)") {
			t.Errorf("error text: %v", err)
		}
		inb := section(t, st, ops.SectionInbox)
		if inb.State != ops.SectionFailed || !inb.Required || !slices.Equal(inb.Missing, []string{"ferry_inbox_parked"}) {
			t.Errorf("inbox section %+v", inb)
		}
		if len(st.Consumers) != 0 {
			t.Errorf("a failed inbox section still reports consumers (as zero): %+v", st.Consumers)
		}
		if st.Outbox.Pending != 1 || !st.SectionOK(ops.SectionOutbox) {
			t.Errorf("the other sections must still be read: outbox %+v", st.Outbox)
		}
		m = gatherOps(t, e)
		if v, ok := m["ferry_ops_up"]; !ok || v != 0 {
			t.Errorf("ferry_ops_up = %v (present %v), want 0", v, ok)
		}
		if v, ok := m[`ferry_ops_section_up{section="inbox"}`]; !ok || v != 0 {
			t.Errorf(`ferry_ops_section_up{section="inbox"} = %v (present %v), want 0`, v, ok)
		}
		if m[`ferry_ops_section_up{section="outbox"}`] != 1 || sumPrefix(m, `ferry_ops_outbox_pending{`) != 1 {
			t.Errorf("healthy sections must still export: %v", m)
		}
		for k := range m {
			if strings.HasPrefix(k, "ferry_ops_inbox_") {
				t.Errorf("failed inbox section exports %s", k)
			}
		}

		// The relay instances table is dropped: the relay section fails
		// instead of vanishing, and no "0 live relays / 0 unowned" is exported.
		mustExec(t, e, "DROP TABLE "+tn("relay_instances"))
		st, err = e.ops.Status(ctx)
		if !errors.As(err, &se) || len(se.Failed) != 2 || !strings.Contains(err.Error(), "section relay failed: table ferry_relay_instances missing") {
			t.Fatalf("status with ferry_relay_instances dropped: %v", err)
		}
		if rs := section(t, st, ops.SectionRelay); rs.State != ops.SectionFailed {
			t.Errorf("relay section %+v", rs)
		}
		m = gatherOps(t, e)
		if v, ok := m[`ferry_ops_section_up{section="relay"}`]; !ok || v != 0 {
			t.Errorf("relay section_up = %v (present %v)", v, ok)
		}
		for _, k := range []string{"ferry_ops_relay_unowned_shards", "ferry_ops_relay_live_instances"} {
			if _, ok := m[k]; ok {
				t.Errorf("failed relay section exports %s = %v", k, m[k])
			}
		}

		// The outbox itself is always required.
		mustExec(t, e, "DROP TABLE "+tn("outbox"))
		_, err = e.ops.Status(ctx)
		if err == nil || !strings.Contains(err.Error(), "section outbox failed: table ferry_outbox missing (the outbox is always required)") {
			t.Fatalf("status without the outbox: %v", err)
		}
		if m = gatherOps(t, e); m["ferry_ops_up"] != 0 || m[`ferry_ops_section_up{section="outbox"}`] != 0 || hasPrefix(m, "ferry_ops_outbox_") {
			t.Errorf("metrics without the outbox: %v", m)
		}
	})
}

// sumPrefix sums the series whose key (name{labels}) starts with prefix.
func sumPrefix(m map[string]float64, prefix string) float64 {
	var n float64
	for k, v := range m {
		if strings.HasPrefix(k, prefix) {
			n += v
		}
	}
	return n
}

// hasPrefix reports whether any series key starts with prefix.
func hasPrefix(m map[string]float64, prefix string) bool {
	for k := range m {
		if strings.HasPrefix(k, prefix) {
			return true
		}
	}
	return false
}

func hasKey(m map[string]float64, k string) bool { _, ok := m[k]; return ok }

// A table that exists but cannot be read (here a column renamed away) fails
// its section with the database's error.
func TestStatusUnreadableTableFailsSection(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		mustExec(t, e, fmt.Sprintf("ALTER TABLE %s RENAME COLUMN reason TO reason_gone", tn("inbox_parked")))
		st, err := e.ops.Status(context.Background())
		if !errors.Is(err, ops.ErrStatusIncomplete) {
			t.Fatalf("status: %v", err)
		}
		inb := section(t, st, ops.SectionInbox)
		if inb.State != ops.SectionFailed || len(inb.Missing) != 0 || !strings.Contains(inb.Error, "reason") {
			t.Fatalf("inbox section %+v", inb)
		}
		if m := gatherOps(t, e); m[`ferry_ops_section_up{section="inbox"}`] != 0 || m["ferry_ops_up"] != 0 {
			t.Fatalf("metrics: %v", m)
		}
	})
}

// "Should exist" follows the migrations: a section none of whose tables
// exist and whose migration is not recorded is not installed (no error,
// no gauge); one whose migration is recorded, or some of whose tables
// exist, is required.
func TestStatusNotInstalledVersusRequired(t *testing.T) {
	both(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		for _, tbl := range []string{"inbox_parked", "inbox_cursor", "inbox"} {
			mustExec(t, e, "DROP TABLE "+tn(tbl))
		}
		// Recorded as applied: required, failed.
		if _, err := e.ops.Status(ctx); err == nil || !strings.Contains(err.Error(),
			"section inbox failed: table ferry_inbox, ferry_inbox_cursor, ferry_inbox_parked missing (migration 0003_inbox is recorded as applied)") {
			t.Fatalf("status: %v", err)
		}
		// Not recorded (the DDL is applied by another tool, without the
		// inbox part): not installed, and that is fine.
		mustExec(t, e, fmt.Sprintf("DELETE FROM %s WHERE version = 3", tn("migrations")))
		st, err := e.ops.Status(ctx)
		if err != nil {
			t.Fatalf("status: %v", err)
		}
		if inb := section(t, st, ops.SectionInbox); inb.State != ops.SectionNotInstalled || inb.Required {
			t.Fatalf("inbox section %+v", inb)
		}
		m := gatherOps(t, e)
		if m["ferry_ops_up"] != 1 || hasKey(m, `ferry_ops_section_up{section="inbox"}`) {
			t.Fatalf("metrics: %v", m)
		}
		// Not recorded, but partly there: required.
		mustExec(t, e, "DROP TABLE "+tn("relay_instances"))
		mustExec(t, e, fmt.Sprintf("DELETE FROM %s WHERE version = 2", tn("migrations")))
		if _, err := e.ops.Status(ctx); err == nil || !strings.Contains(err.Error(),
			"section relay failed: table ferry_relay_instances missing (other tables of that migration exist)") {
			t.Fatalf("status: %v", err)
		}
		// Without any migrations table at all, the same rules hold.
		mustExec(t, e, "DROP TABLE "+tn("migrations"))
		st, err = e.ops.Status(ctx)
		if rs := section(t, st, ops.SectionRelay); err == nil || rs.State != ops.SectionFailed {
			t.Fatalf("status without a migrations table: %v %+v", err, rs)
		}
	})
}

var createTableRE = regexp.MustCompile(`(?i)CREATE TABLE (?:IF NOT EXISTS )?("?[A-Za-z0-9_."]+)`)

// The sections' table lists are the tables each migration creates, on
// both dialects: a new table in a migration must be added to its section.
func TestStatusSectionsMatchMigrations(t *testing.T) {
	for _, e := range []*env{newPostgres(t), newSQLite(t)} {
		st, err := e.ops.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		d := e.dialect
		ms, err := migrate.Load(d, tables)
		if err != nil {
			t.Fatal(err)
		}
		byMig := map[string][]string{}
		for _, m := range ms {
			name := fmt.Sprintf("%04d_%s", m.Version, m.Name)
			byMig[name] = []string{}
			for _, c := range createTableRE.FindAllStringSubmatch(m.SQL, -1) {
				tbl := strings.Trim(c[1], `"`)
				// A table rebuilt under a temporary name (SQLite cannot
				// alter a CHECK constraint) and renamed back is not new.
				if regexp.MustCompile(`(?i)ALTER TABLE "?` + regexp.QuoteMeta(tbl) + `"? RENAME TO`).MatchString(m.SQL) {
					continue
				}
				byMig[name] = append(byMig[name], tbl)
			}
			sort.Strings(byMig[name])
			if len(byMig[name]) == 0 {
				delete(byMig, name) // e.g. 0006_cdc on SQLite: no section
			}
		}
		got := map[string][]string{}
		for _, s := range st.Sections {
			tbls := slices.Clone(s.Tables)
			sort.Strings(tbls)
			got[s.Migration] = tbls
		}
		if fmt.Sprint(got) != fmt.Sprint(byMig) {
			t.Errorf("%s: sections %v, migrations create %v", d, got, byMig)
		}
	}
}
