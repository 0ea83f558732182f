package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

// docFlag is one flag documented in docs/RELAY.md's flag table.
type docFlag struct {
	name, def string // def "" when the row's default cell does not split per flag
}

var docFlagName = regexp.MustCompile("`--([a-z0-9-]+)`")

// relayDocFlags parses the flag table of docs/RELAY.md: the rows after the
// "| flag (env `FERRY_…`) |" header, up to the first line that is not a
// table row. A row's first cell lists one or more `--flag`s; when its
// default cell has as many comma-separated parts, each flag gets its own.
func relayDocFlags(t *testing.T) map[string]docFlag {
	t.Helper()
	src, err := os.ReadFile("../../docs/RELAY.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(src), "\n")
	start := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "| flag (env `FERRY_") })
	if start < 0 {
		t.Fatal("docs/RELAY.md has no flag table (| flag (env `FERRY_…`) | … |)")
	}
	out := map[string]docFlag{}
	for _, l := range lines[start+2:] {
		if !strings.HasPrefix(l, "|") {
			break
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		if len(cells) < 3 {
			t.Fatalf("flag table row with %d cells: %q", len(cells), l)
		}
		names := docFlagName.FindAllStringSubmatch(cells[0], -1)
		if len(names) == 0 {
			t.Fatalf("flag table row names no --flag: %q", l)
		}
		defs := strings.Split(cells[1], ",")
		for i, m := range names {
			if _, dup := out[m[1]]; dup {
				t.Errorf("docs/RELAY.md documents --%s twice", m[1])
			}
			d := docFlag{name: m[1]}
			if len(defs) == len(names) {
				d.def = strings.Trim(strings.TrimSpace(defs[i]), "`")
			}
			out[m[1]] = d
		}
	}
	return out
}

// sameDefault compares a documented default with the flag's, for the forms
// the table uses: numbers, booleans, durations, literal strings; "—" and
// prose ("hostname-pid-random", "search_path", "— (required)") mean "no
// default" and match an empty one.
func sameDefault(doc string, fl *pflag.Flag) bool {
	switch fl.Value.Type() {
	case "duration":
		dd, err1 := time.ParseDuration(doc)
		if doc == "0" {
			dd, err1 = 0, nil
		}
		fd, err2 := time.ParseDuration(fl.DefValue)
		return err1 == nil && err2 == nil && dd == fd
	case "int", "bool":
		return doc == fl.DefValue
	}
	if fl.DefValue == "" {
		return true // documented in prose (what the empty value means)
	}
	if doc == `""` {
		return fl.DefValue == ""
	}
	return doc == fl.DefValue
}

// TestRelayFlagsMatchDocs: every flag of `ferry relay` (poll and cdc mode
// share one flag set) is in docs/RELAY.md's flag table, every flag there
// exists, and each documented default is the flag's default.
func TestRelayFlagsMatchDocs(t *testing.T) {
	doc := relayDocFlags(t)
	cmd := newRelayCmd()
	have := map[string]*pflag.Flag{}
	cmd.Flags().VisitAll(func(fl *pflag.Flag) {
		if fl.Name != "help" && !fl.Hidden {
			have[fl.Name] = fl
		}
	})
	for _, must := range []string{"slot", "publication", "mode", "source", "workers"} {
		if have[must] == nil {
			t.Errorf("ferry relay has no --%s", must)
		}
	}
	for name, fl := range have {
		d, ok := doc[name]
		if !ok {
			t.Errorf("ferry relay --%s (%s) is not documented in docs/RELAY.md's flag table", name, fl.Usage)
			continue
		}
		if d.def != "" && !sameDefault(d.def, fl) {
			t.Errorf("--%s: docs/RELAY.md says default %q, the flag's is %q", name, d.def, fl.DefValue)
		}
	}
	for name := range doc {
		if have[name] == nil {
			t.Errorf("docs/RELAY.md documents --%s, which ferry relay does not have", name)
		}
	}
	if len(doc) < 20 {
		t.Fatalf("parsed only %d documented flags: the table parser is broken", len(doc))
	}
}

// TestRelayDocFlagParserCatchesDrift: the comparison fails both ways — a
// documented flag that does not exist (docs/RELAY.md once listed
// --workers when the command had none) and a flag missing from the docs.
func TestRelayDocFlagParserCatchesDrift(t *testing.T) {
	doc := relayDocFlags(t)
	cmd := newRelayCmd()
	if cmd.Flags().Lookup("workers") == nil || doc["workers"].name == "" {
		t.Fatal("--workers must exist and be documented")
	}
	if _, ok := doc["no-such-flag"]; ok || cmd.Flags().Lookup("no-such-flag") != nil {
		t.Fatal("impossible")
	}
	// A default drift is seen.
	fl := cmd.Flags().Lookup("batch-size")
	if sameDefault("1000", fl) || !sameDefault("2000", fl) {
		t.Fatal("sameDefault does not compare int defaults")
	}
	if fl := cmd.Flags().Lookup("backoff-max"); !sameDefault("5m", fl) || sameDefault("5s", fl) {
		t.Fatal("sameDefault does not compare durations")
	}
	if fl := cmd.Flags().Lookup("source"); !sameDefault("ferry", fl) || sameDefault("ferry://x", fl) {
		t.Fatal("sameDefault does not compare strings")
	}
}

func TestAMQPTopicMatch(t *testing.T) {
	for _, c := range []struct {
		pattern, key string
		want         bool
	}{
		{"#", "order.events", true}, {"#", "", true}, {"order.*", "order.events", true}, {"order.*", "order.events.x", false},
		{"order.#", "order", true}, {"order.#", "order.a.b", true}, {"*.events", "payment.events", true},
		{"order.events", "payment.events", false}, {"#.events", "a.b.events", true}, {"*", "a.b", false},
	} {
		if got := amqpTopicMatch(c.pattern, c.key); got != c.want {
			t.Errorf("amqpTopicMatch(%q, %q) = %v, want %v", c.pattern, c.key, got, c.want)
		}
	}
}
