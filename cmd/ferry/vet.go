package main

import (
	"fmt"
	"go/token"
	"sort"

	"github.com/spf13/cobra"
	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/checker"
	"golang.org/x/tools/go/packages"

	"github.com/ferryhq/ferry/vet/dualwrite"
)

func newVetCmd() *cobra.Command {
	var dir string
	var tests bool
	cmd := &cobra.Command{
		Use:   "vet [packages]",
		Short: "Find dual writes: a broker publish beside a database write outside the outbox",
		Long: `vet loads the named Go packages (default ./...) and reports every broker
publish (NATS, JetStream, Kafka via franz-go, sarama or kafka-go, RabbitMQ,
Watermill, SNS/SQS, Google Pub/Sub) in a function that also writes to a
database (database/sql, pgx, sqlx, GORM, ent) without a Ferry outbox: the
dual writes to move to outbox.InsertTx. Each finding names the shape (after
commit, before commit, in a defer, inside the transaction, in a goroutine)
and why it loses or invents events.

The analysis covers a function, its closures and its direct callees in the
same package (one level); interface calls are not followed. Accept a
reviewed case with a comment "//ferry:ignore dualwrite <reason>" on or above
the line, or in the function's doc comment.

Exit status 1 when anything is found, 2 when the packages do not load. The
same analyzer runs under go vet as cmd/ferry-vet:
  go vet -vettool=$(which ferry-vet) ./...`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				args = []string{"./..."}
			}
			n, err := runVet(cmd, dir, tests, args)
			if err != nil {
				return err
			}
			if n > 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "ferry vet: %d dual write(s) found\n", n)
				return exitCodeError{code: 1}
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory to load the packages from (default: the current directory)")
	cmd.Flags().BoolVar(&tests, "tests", true, "also analyse _test.go files")
	return cmd
}

// runVet prints each finding as file:line:col: message and returns how many.
func runVet(cmd *cobra.Command, dir string, tests bool, patterns []string) (int, error) {
	cfg := &packages.Config{
		Mode:    packages.LoadAllSyntax | packages.NeedModule,
		Context: cmd.Context(),
		Dir:     dir,
		Tests:   tests,
	}
	pkgs, err := packages.Load(cfg, patterns...)
	if err != nil {
		return 0, fmt.Errorf("ferry vet: load %v: %w", patterns, err)
	}
	var loadErrs []string
	packages.Visit(pkgs, nil, func(p *packages.Package) {
		for _, e := range p.Errors {
			loadErrs = append(loadErrs, e.Error())
		}
	})
	if len(loadErrs) > 0 {
		for _, e := range loadErrs {
			fmt.Fprintln(cmd.ErrOrStderr(), e)
		}
		return 0, exitCodeError{code: 2}
	}
	if len(pkgs) == 0 {
		return 0, fmt.Errorf("ferry vet: no packages match %v", patterns)
	}
	g, err := checker.Analyze([]*analysis.Analyzer{dualwrite.Analyzer}, pkgs, nil)
	if err != nil {
		return 0, fmt.Errorf("ferry vet: %w", err)
	}
	type finding struct {
		pos token.Position
		msg string
	}
	seen := map[finding]bool{}
	var out []finding
	for act := range g.All() {
		if !act.IsRoot {
			continue
		}
		if act.Err != nil {
			return 0, fmt.Errorf("ferry vet: %s: %w", act.Package.PkgPath, act.Err)
		}
		for _, d := range act.Diagnostics {
			f := finding{act.Package.Fset.Position(d.Pos), d.Message}
			if !seen[f] { // a package and its test variant report the same line
				seen[f] = true
				out = append(out, f)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i].pos, out[j].pos
		if a.Filename != b.Filename {
			return a.Filename < b.Filename
		}
		return a.Offset < b.Offset
	})
	for _, f := range out {
		fmt.Fprintf(cmd.OutOrStdout(), "%s: %s\n", f.pos, f.msg)
	}
	return len(out), nil
}
