package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ferryhq/ferry/internal/producebench"
	"github.com/ferryhq/ferry/internal/testenv"
)

// `ferry bench produce --reference` runs every variant and reports a rate,
// the (c)/(b) ratio and, for a local Postgres, CPU per transaction.
func TestBenchProduceReference(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs six benchmark variants")
	}
	s := testenv.NewPostgresSchema(t)
	out, err := runCLI(t, "bench", "produce", "--database-url", s.URL, "--clients", "2", "--rounds", "1",
		"--duration", "150ms", "--reference", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var rows []struct {
		Clients   int                `json:"clients"`
		Rates     map[string]float64 `json:"median_tx_per_sec"`
		Ratio     float64            `json:"c_over_b"`
		ServerCPU map[string]float64 `json:"median_server_cpu_us_per_tx"`
		ClientCPU map[string]float64 `json:"median_client_cpu_us_per_tx"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(rows) != 1 || rows[0].Clients != 2 {
		t.Fatalf("rows %+v", rows)
	}
	r := rows[0]
	all := append(append([]producebench.Variant{}, producebench.Variants...), producebench.ReferenceVariants...)
	for _, v := range all {
		if r.Rates[string(v)] <= 0 {
			t.Errorf("variant %s: rate %v", v, r.Rates[string(v)])
		}
		if r.ClientCPU != nil && r.ClientCPU[string(v)] <= 0 {
			t.Errorf("variant %s: client CPU %v", v, r.ClientCPU[string(v)])
		}
	}
	if r.Ratio <= 0 {
		t.Errorf("c_over_b = %v", r.Ratio)
	}
	if r.ClientCPU == nil {
		t.Error("client CPU per transaction missing")
	}

	text, err := runCLI(t, "bench", "produce", "--database-url", s.URL, "--clients", "1", "--rounds", "1", "--duration", "100ms")
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	for _, want := range []string{"(c)/(b)", "c_ferry_sequenced", "server CPU µs"} {
		if !strings.Contains(text, want) {
			t.Errorf("table output lacks %q:\n%s", want, text)
		}
	}
	if strings.Contains(text, "x_on_conflict_floor") {
		t.Errorf("reference variants ran without --reference:\n%s", text)
	}
}

// `ferry bench produce --database-url mysql://…` measures the three variants
// in a scratch database it drops afterwards; --reference is refused there.
func TestBenchProduceMySQL(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: runs three benchmark variants")
	}
	url := testenv.MySQLURL(t)
	out, err := runCLI(t, "bench", "produce", "--database-url", url, "--clients", "2", "--rounds", "1", "--duration", "150ms", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var rows []struct {
		Rates map[string]float64 `json:"median_tx_per_sec"`
		Ratio float64            `json:"c_over_b"`
	}
	if err := json.Unmarshal([]byte(out), &rows); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if len(rows) != 1 || rows[0].Ratio <= 0 {
		t.Fatalf("rows %+v", rows)
	}
	for _, v := range producebench.Variants {
		if rows[0].Rates[string(v)] <= 0 {
			t.Errorf("variant %s: rate %v", v, rows[0].Rates[string(v)])
		}
	}
	if _, err := runCLI(t, "bench", "produce", "--database-url", url, "--reference", "--duration", "10ms"); err == nil || !strings.Contains(err.Error(), "--reference") {
		t.Errorf("--reference on mysql: err = %v, want a refusal naming the flag", err)
	}
}
