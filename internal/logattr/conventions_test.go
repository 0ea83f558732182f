package logattr_test

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// TestConventions walks every non-test .go file of the module and fails on
// a log call (a *slog.Logger method or a log/slog package function) that
//
//   - logs an error under a literal key ("err", "error") instead of
//     logattr.Err(err) or slog.String(logattr.ErrKey, s), or logs an
//     error-looking value (err, fooErr, x.Error()) under another key; or
//   - uses Debug/Info/Warn/Error, or Log/LogAttrs with
//     context.Background()/TODO(), where a context is in scope: a
//     context.Context parameter of an enclosing function, a local named
//     ctx defined before the call, or an *http.Request parameter (whose
//     Context() is the one to pass).
//
// Loggers are recognised by name: every identifier the module declares
// with type *slog.Logger (fields, parameters, variables), assigns from
// slog.New/slog.Default/logattr.OrDefault/With/WithGroup or from a function
// returning *slog.Logger, plus the slog package itself.
func TestConventions(t *testing.T) {
	root := moduleRoot(t)
	fset := token.NewFileSet()
	var files []*ast.File
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			if path != root && (strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "vendor") {
				return filepath.SkipDir
			}
			if path != root {
				if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
					return filepath.SkipDir // another module
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files = append(files, f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 50 {
		t.Fatalf("parsed only %d files under %s; the walk is broken", len(files), root)
	}
	v := check(fset, files)
	calls := v.calls
	for _, p := range v.problems {
		rel, _ := filepath.Rel(root, p.pos.Filename)
		t.Errorf("%s:%d:%d: %s", rel, p.pos.Line, p.pos.Column, p.msg)
	}
	if calls < 50 {
		t.Errorf("recognised only %d log calls; the logger detection is broken", calls)
	}
	t.Logf("%d files, %d log calls checked", len(files), calls)
}

// TestConventionsCatches is the negative control: the checker flags each
// kind of violation in a small source, and accepts the conventional form.
func TestConventionsCatches(t *testing.T) {
	src := `package p

import (
	"context"
	"log/slog"
	"net/http"
)

type relay struct{ log *slog.Logger }

func (r *relay) run(ctx context.Context, err error) {
	r.log.Warn("cycle failed", logattr.Err(err))                              // 1: no ctx
	r.log.WarnContext(ctx, "cycle failed", "error", err)                       // 2: key
	r.log.WarnContext(ctx, "cycle failed", "err", err)                         // 3: literal key
	r.log.WarnContext(ctx, "cycle failed", "cause", err)                       // 4: error under another key
	r.log.WarnContext(ctx, "cycle failed", slog.String("error", err.Error()))  // 5: key
	r.log.Log(context.Background(), slog.LevelWarn, "x")                      // 6: Background
	go func() {
		slog.Info("inner")                                                      // 7: ctx captured
	}()
	r.log.WarnContext(ctx, "cycle failed", logattr.Err(err), "shard", 3)       // fine
	r.log.LogAttrs(ctx, slog.LevelWarn, "x", slog.String(logattr.ErrKey, "s")) // fine
}

func (r *relay) noCtx(err error) {
	r.log.Warn("cycle failed", logattr.Err(err)) // fine: no ctx in scope
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	r.log.Info("after ctx", "n", 1) // 8: local ctx
	_ = ctx
}

func handler(w http.ResponseWriter, req *http.Request) {
	l := slog.Default().With("path", req.URL.Path)
	l.Error("failed")                              // 9: request context
}
`
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "p.go", src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	v := check(fset, []*ast.File{f})
	var lines []int
	for _, p := range v.problems {
		lines = append(lines, p.pos.Line)
	}
	want := []int{12, 13, 14, 15, 16, 17, 19, 29, 35}
	if fmt.Sprint(lines) != fmt.Sprint(want) {
		for _, p := range v.problems {
			t.Logf("%d: %s", p.pos.Line, p.msg)
		}
		t.Fatalf("flagged lines %v, want %v", lines, want)
	}
}

type problem struct {
	pos token.Position
	msg string
}

type result struct {
	problems []problem
	calls    int
}

var logMethods = map[string]int{ // method → index of the first key/value argument
	"Debug": 1, "Info": 1, "Warn": 1, "Error": 1,
	"DebugContext": 2, "InfoContext": 2, "WarnContext": 2, "ErrorContext": 2,
	"Log": 3, "LogAttrs": 3, "With": 0,
}

func check(fset *token.FileSet, files []*ast.File) result {
	loggers := map[string]bool{"slog": true}
	loggerFuncs := map[string]bool{"Default": true, "New": true, "OrDefault": true, "With": true, "WithGroup": true}
	isLoggerType := func(e ast.Expr) bool {
		s, ok := e.(*ast.StarExpr)
		if !ok {
			return false
		}
		sel, ok := s.X.(*ast.SelectorExpr)
		if !ok {
			return false
		}
		id, ok := sel.X.(*ast.Ident)
		return ok && id.Name == "slog" && sel.Sel.Name == "Logger"
	}
	// Pass 1: names declared as *slog.Logger, functions returning one.
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.Field:
				if isLoggerType(n.Type) {
					for _, id := range n.Names {
						loggers[id.Name] = true
					}
				}
			case *ast.ValueSpec:
				if n.Type != nil && isLoggerType(n.Type) {
					for _, id := range n.Names {
						loggers[id.Name] = true
					}
				}
			case *ast.FuncDecl:
				if n.Type.Results != nil && len(n.Type.Results.List) == 1 && isLoggerType(n.Type.Results.List[0].Type) {
					loggerFuncs[n.Name.Name] = true
				}
			}
			return true
		})
	}
	lastName := func(e ast.Expr) string {
		switch e := e.(type) {
		case *ast.Ident:
			return e.Name
		case *ast.SelectorExpr:
			return e.Sel.Name
		}
		return ""
	}
	var isLogger func(e ast.Expr) bool
	isLogger = func(e ast.Expr) bool {
		switch e := e.(type) {
		case *ast.Ident, *ast.SelectorExpr:
			return loggers[lastName(e)]
		case *ast.CallExpr:
			if sel, ok := e.Fun.(*ast.SelectorExpr); ok && (sel.Sel.Name == "With" || sel.Sel.Name == "WithGroup") {
				return isLogger(sel.X)
			}
			return loggerFuncs[lastName(e.Fun)] && lastName(e.Fun) != "With" && lastName(e.Fun) != "WithGroup"
		case *ast.ParenExpr:
			return isLogger(e.X)
		}
		return false
	}
	// Pass 1b: names assigned a logger, to a fixed point.
	for changed := true; changed; {
		changed = false
		for _, f := range files {
			ast.Inspect(f, func(n ast.Node) bool {
				var lhs []ast.Expr
				var rhs []ast.Expr
				switch n := n.(type) {
				case *ast.AssignStmt:
					lhs, rhs = n.Lhs, n.Rhs
				case *ast.ValueSpec:
					for _, id := range n.Names {
						lhs = append(lhs, id)
					}
					rhs = n.Values
				default:
					return true
				}
				if len(lhs) != len(rhs) {
					return true
				}
				for i, r := range rhs {
					if c, ok := r.(*ast.CallExpr); ok && isLogger(c) {
						if name := lastName(lhs[i]); name != "" && name != "_" && !loggers[name] {
							loggers[name] = true
							changed = true
						}
					}
				}
				return true
			})
		}
	}

	var res result
	report := func(pos token.Pos, format string, args ...any) {
		res.problems = append(res.problems, problem{fset.Position(pos), fmt.Sprintf(format, args...)})
	}
	for _, f := range files {
		var stack []ast.Node // enclosing FuncDecl / FuncLit
		ast.Inspect(f, func(n ast.Node) bool {
			if n == nil {
				return true
			}
			// Pop functions that ended before this node.
			for len(stack) > 0 && stack[len(stack)-1].End() <= n.Pos() {
				stack = stack[:len(stack)-1]
			}
			switch n := n.(type) {
			case *ast.FuncDecl, *ast.FuncLit:
				stack = append(stack, n)
				return true
			case *ast.CallExpr:
				sel, ok := n.Fun.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				first, ok := logMethods[sel.Sel.Name]
				if !ok || !isLogger(sel.X) || len(n.Args) < first {
					return true
				}
				if sel.Sel.Name == "With" {
					if id, ok := sel.X.(*ast.Ident); ok && id.Name == "slog" {
						return true // slog.With uses the default logger; keys still checked below
					}
				} else {
					res.calls++
				}
				checkKeys(n.Args[first:], func(pos token.Pos, msg string) { report(pos, "%s", msg) })
				ctxName := ctxInScope(stack, n.Pos())
				if ctxName == "" {
					return true
				}
				switch sel.Sel.Name {
				case "Debug", "Info", "Warn", "Error":
					report(n.Pos(), "%s.%s without the context in scope: use %sContext(%s, …)", exprString(sel.X), sel.Sel.Name, sel.Sel.Name, ctxName)
				case "Log", "LogAttrs":
					if c, ok := n.Args[0].(*ast.CallExpr); ok {
						if s, ok := c.Fun.(*ast.SelectorExpr); ok && exprString(s.X) == "context" {
							report(n.Pos(), "%s.%s(context.%s(), …) with a context in scope: pass %s", exprString(sel.X), sel.Sel.Name, s.Sel.Name, ctxName)
						}
					}
				}
			}
			return true
		})
	}
	sort.SliceStable(res.problems, func(i, j int) bool {
		a, b := res.problems[i].pos, res.problems[j].pos
		if a.Filename != b.Filename {
			return a.Filename < b.Filename
		}
		return a.Line < b.Line
	})
	return res
}

// checkKeys walks slog's key/value arguments.
func checkKeys(args []ast.Expr, report func(token.Pos, string)) {
	checkKey := func(pos token.Pos, key string, val ast.Expr) {
		switch strings.ToLower(key) {
		case "err", "error":
			report(pos, fmt.Sprintf("error logged under the literal key %q: use logattr.Err(err) (or slog.String(logattr.ErrKey, s))", key))
			return
		}
		if looksLikeError(val) {
			report(pos, fmt.Sprintf("error value %s logged under key %q: use logattr.Err", exprString(val), key))
		}
	}
	for i := 0; i < len(args); i++ {
		switch a := args[i].(type) {
		case *ast.BasicLit:
			if a.Kind != token.STRING {
				continue
			}
			key, _ := strconv.Unquote(a.Value)
			var val ast.Expr
			if i+1 < len(args) {
				val = args[i+1]
			}
			checkKey(a.Pos(), key, val)
			i++
		case *ast.CallExpr:
			sel, ok := a.Fun.(*ast.SelectorExpr)
			if !ok || exprString(sel.X) != "slog" || len(a.Args) < 2 {
				continue
			}
			if lit, ok := a.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				key, _ := strconv.Unquote(lit.Value)
				checkKey(lit.Pos(), key, a.Args[1])
			}
		}
	}
}

// looksLikeError: err, fooErr, workerErr, x.err, x.Error().
func looksLikeError(e ast.Expr) bool {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name == "err" || strings.HasSuffix(e.Name, "Err")
	case *ast.SelectorExpr:
		return e.Sel.Name == "err" || strings.HasSuffix(e.Sel.Name, "Err")
	case *ast.CallExpr:
		if s, ok := e.Fun.(*ast.SelectorExpr); ok && s.Sel.Name == "Error" && len(e.Args) == 0 {
			return true
		}
	}
	return false
}

// ctxInScope returns how to name the context in scope at pos, or "".
func ctxInScope(stack []ast.Node, pos token.Pos) string {
	for i := len(stack) - 1; i >= 0; i-- {
		var ft *ast.FuncType
		var body *ast.BlockStmt
		switch fn := stack[i].(type) {
		case *ast.FuncDecl:
			ft, body = fn.Type, fn.Body
		case *ast.FuncLit:
			ft, body = fn.Type, fn.Body
		}
		if ft.Params != nil {
			for _, fld := range ft.Params.List {
				t := exprString(fld.Type)
				for _, id := range fld.Names {
					if id.Name == "_" {
						continue
					}
					switch t {
					case "context.Context":
						return id.Name
					case "*http.Request":
						return id.Name + ".Context()"
					}
				}
			}
		}
		if body == nil {
			continue
		}
		found := ""
		ast.Inspect(body, func(n ast.Node) bool {
			if found != "" || n == nil || n.Pos() >= pos {
				return false
			}
			if _, ok := n.(*ast.FuncLit); ok && !(n.Pos() <= pos && pos < n.End()) {
				return false // a sibling closure's locals are not in scope
			}
			switch n := n.(type) {
			case *ast.AssignStmt:
				if n.Tok == token.DEFINE {
					for _, l := range n.Lhs {
						if id, ok := l.(*ast.Ident); ok && id.Name == "ctx" {
							found = "ctx"
						}
					}
				}
			case *ast.ValueSpec:
				for _, id := range n.Names {
					if id.Name == "ctx" {
						found = "ctx"
					}
				}
			}
			return true
		})
		if found != "" {
			return found
		}
	}
	return ""
}

func exprString(e ast.Expr) string {
	switch e := e.(type) {
	case *ast.Ident:
		return e.Name
	case *ast.SelectorExpr:
		return exprString(e.X) + "." + e.Sel.Name
	case *ast.StarExpr:
		return "*" + exprString(e.X)
	case *ast.CallExpr:
		return exprString(e.Fun) + "()"
	case *ast.ParenExpr:
		return exprString(e.X)
	}
	return fmt.Sprintf("%T", e)
}

func moduleRoot(t *testing.T) string {
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && strings.Contains(string(b), "module github.com/ferryhq/ferry\n") {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("module root (go.mod of github.com/ferryhq/ferry) not found")
		}
		dir = parent
	}
}
