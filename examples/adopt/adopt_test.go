package adopt_test

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/checker"
	"golang.org/x/tools/go/packages"

	"github.com/ferryhq/ferry/examples/adopt"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/vet/dualwrite"
	"github.com/ferryhq/ferry/vet/dualwrite/dualwritetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, testenv.KnownLibraryLeaks()...)
}

// analyze copies the named files of this example into a package of the
// dualwrite fixture module (the analyzer skips Ferry's own packages, so the
// example is analysed as a service's code would be, under example.com/svc)
// and returns the analyzer's findings there as "file:line: message".
func analyze(t *testing.T, pkg string, files ...string) []string {
	t.Helper()
	mod := dualwritetest.Fixture(t)
	dst := filepath.Join(mod, pkg)
	if err := os.MkdirAll(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dst, filepath.Base(f)), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := &packages.Config{Mode: packages.LoadAllSyntax, Dir: mod, Env: append(os.Environ(), "GOPROXY=off", "GOFLAGS=-mod=mod", "GOWORK=off")}
	pkgs, err := packages.Load(cfg, "./"+pkg)
	if err != nil {
		t.Fatal(err)
	}
	packages.Visit(pkgs, nil, func(p *packages.Package) {
		for _, e := range p.Errors {
			t.Errorf("load %s: %v", p.PkgPath, e)
		}
	})
	if t.Failed() {
		t.FailNow()
	}
	g, err := checker.Analyze([]*analysis.Analyzer{dualwrite.Analyzer}, pkgs, nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for act := range g.All() {
		if !act.IsRoot {
			continue
		}
		if act.Err != nil {
			t.Fatalf("%s: %v", act.Package.PkgPath, act.Err)
		}
		for _, d := range act.Diagnostics {
			p := act.Package.Fset.Position(d.Pos)
			out = append(out, filepath.Base(p.Filename)+":"+strconv.Itoa(p.Line)+": "+d.Message)
		}
	}
	return out
}

// lineOf returns the 1-based line of the first line of file containing s.
func lineOf(t *testing.T, file, s string) int {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		if strings.Contains(sc.Text(), s) {
			return n
		}
	}
	t.Fatalf("%s: no line contains %q", file, s)
	return 0
}

// The old version's dual write is what ferry vet reports: one finding, on
// the publish, naming the handler, the shape (after commit) and the commit
// it pairs with.
func TestLegacyFinding(t *testing.T) {
	got := analyze(t, "adoptlegacy", "legacy/legacy.go")
	pub := lineOf(t, "legacy/legacy.go", "s.JS.Publish(ctx, Subject, body)")
	commit := lineOf(t, "legacy/legacy.go", "tx.Commit()")
	if len(got) != 1 {
		t.Fatalf("findings %q, want exactly 1", got)
	}
	t.Log(got[0])
	for _, want := range []string{
		"legacy.go:" + strconv.Itoa(pub) + ": dual write: PlaceOrder publishes ",
		"after commit (sql.Tx.Commit at line " + strconv.Itoa(commit) + ")",
		"outbox.InsertTx",
	} {
		if !strings.Contains(got[0], want) {
			t.Errorf("finding %q does not contain %q", got[0], want)
		}
	}
}

// The fixed handler writes through the outbox: nothing to report.
func TestFixedIsClean(t *testing.T) {
	if got := analyze(t, "adoptfixed", "adopt.go"); len(got) != 0 {
		t.Errorf("findings on the fixed service: %q", got)
	}
}

func TestSideBySideUnderFaults(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const n = 200
	res, err := adopt.Run(ctx, adopt.Config{Dir: t.TempDir(), Orders: n, CutRate: 0.1, Seed: 7, RelayCrashes: 3})
	if err != nil {
		t.Fatal(err)
	}
	rep := res.Report
	t.Logf("\n%s", adopt.Figure(res))
	if len(res.Cut) == 0 || len(res.Cut) == n {
		t.Fatalf("%d of %d publishes cut: the seeded rate must cut some and not all", len(res.Cut), n)
	}
	if res.OldStored != n || res.NewStored != n {
		t.Errorf("stored %d (old) and %d (outbox), want %d each: the cut comes after the commit", res.OldStored, res.NewStored, n)
	}
	if !reflect.DeepEqual(rep.Missing, res.Cut) {
		t.Errorf("old path lost %v, want exactly the %d cut %v", rep.Missing, len(res.Cut), res.Cut)
	}
	if rep.Production != n-len(res.Cut) {
		t.Errorf("production stream holds %d, want %d", rep.Production, n-len(res.Cut))
	}
	if res.Delivered != n {
		t.Errorf("outbox path delivered %d distinct orders, want all %d", res.Delivered, n)
	}
	if res.RelayCrashes != 3 {
		t.Errorf("relay crashed %d times, want the 3 injected", res.RelayCrashes)
	}
	if len(rep.Extra)+len(rep.Differing)+len(rep.Reordered)+len(rep.KeyErrors) != 0 {
		t.Errorf("report %+v: want no extra, differing, reordered or key errors", rep)
	}
	fig := adopt.Figure(res)
	if want := "old dual write lost " + strconv.Itoa(len(res.Cut)) + " of 200"; !strings.Contains(fig, want) || !strings.Contains(fig, "outbox lost 0 of 200") {
		t.Errorf("figure %q: want %q and \"outbox lost 0 of 200\"", fig, want)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	dir := t.TempDir()
	for want, cfg := range map[string]adopt.Config{
		"Config.Dir":          {Orders: 1},
		"Config.Orders":       {Dir: dir, Orders: 0},
		"Config.CutRate":      {Dir: dir, Orders: 1, CutRate: 1.5},
		"Config.RelayCrashes": {Dir: dir, Orders: 1, RelayCrashes: -1},
	} {
		if _, err := adopt.Run(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Run(%+v) = %v, want an error naming %s", cfg, err, want)
		}
	}
}
