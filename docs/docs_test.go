package docs

import (
	"os"
	"strings"
	"testing"
)

// TestGuaranteesMatchREADME: the table agents read (ferry://guarantees) is
// the README's, row for row.
func TestGuaranteesMatchREADME(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(readme)
	i := strings.Index(s, "## Guarantees\n")
	if i < 0 {
		t.Fatal("README has no ## Guarantees section")
	}
	rest := s[i+len("## Guarantees\n"):]
	if j := strings.Index(rest, "\n## "); j >= 0 {
		rest = rest[:j+1]
	}
	want := strings.TrimSpace(rest)
	got := strings.TrimSpace(strings.TrimPrefix(Guarantees, "# Guarantees\n"))
	if got != want {
		t.Fatalf("docs/GUARANTEES.md differs from the README's Guarantees section; copy it over:\n--- README\n%s\n--- GUARANTEES.md\n%s", want, got)
	}
	if !strings.Contains(Operations, "## Dead letter") {
		t.Fatal("OPERATIONS.md has no Dead letter runbook")
	}
}
