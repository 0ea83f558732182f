// Package dualwrite is a go/analysis analyzer that finds dual writes: a
// function that publishes to a message broker and also writes to a database
// without going through a Ferry outbox. Either write can succeed while the
// other fails (or the process dies between them), so the database and the
// broker disagree: an event lost, or an event for a change that was rolled
// back.
//
// # What is matched
//
// Calls are matched through go/types (package path of the declaring package,
// receiver type and method name), never by text, so an import alias or a
// variable name does not matter and a look-alike method on a user type does
// not match.
//
// Publishes: nats.go Conn.Publish* and JetStreamContext.Publish*,
// nats.go/jetstream JetStream.Publish*, franz-go kgo.Client.Produce /
// ProduceSync / TryProduce, amqp091-go and streadway/amqp Channel.Publish*,
// sarama SyncProducer.SendMessage(s) and a send on AsyncProducer.Input(),
// segmentio/kafka-go Writer/Conn.WriteMessages, Watermill
// message.Publisher.Publish, AWS SDK v1/v2 SNS Publish* and SQS SendMessage*,
// Google Cloud Pub/Sub Topic/Publisher.Publish.
//
// Database writes: database/sql DB/Tx/Conn/Stmt Exec*, and Query* whose SQL
// is a constant write statement (INSERT … RETURNING); Tx.Commit; pgx
// Conn/Tx/Pool Exec, CopyFrom, SendBatch, Commit; any method whose first
// result is database/sql.Result or pgconn.CommandTag (so sqlc's DBTX and
// other user interfaces over Exec are covered); sqlx NamedExec* / MustExec*;
// GORM DB.Create/Save/Update*/Delete/Exec; ent builders' Save/Exec (types
// named *Create, *Update, *Delete, *CreateBulk, *UpdateOne, *DeleteOne in a
// package importing entgo.io/ent). An Exec whose SQL is a constant that
// reads (SELECT, SHOW …) is not a write; an Exec with non-constant SQL is
// assumed to write; a Query with non-constant SQL is assumed to read.
// Calls into github.com/ferryhq/ferry/outbox are the outbox write, not a
// dual write.
//
// # Depth and precision limits
//
// The unit is a function declaration together with every function literal
// inside it (closures passed to transaction helpers, defers, goroutines) and
// its direct callees declared in the same package, one level deep: if
// handler H calls save (same package) which Execs and then publishes, H is
// reported at its publish; if save itself calls another helper, that
// helper's writes are not seen from H. Calls through interfaces, function
// values and method values are not followed (except the matched client
// interfaces above), nor calls into other packages. A database write in one
// function and a publish in another, both called from a third function that
// is two levels up, is not reported. Order (before/after commit) is by
// source position within the function, not by control flow.
//
// # Suppressing
//
// A comment `//ferry:ignore dualwrite <reason>` on the line of the report,
// on the line above it, or in the doc comment of the enclosing function
// suppresses the report; the reason is required.
package dualwrite

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"sort"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// Analyzer reports dual writes; see the package documentation.
var Analyzer = &analysis.Analyzer{
	Name:     "dualwrite",
	Doc:      "report a broker publish in a function that also writes to a database outside a Ferry outbox (a dual write)",
	URL:      "https://github.com/ferryhq/ferry/blob/main/docs/ADOPTING.md",
	Run:      run,
	Requires: nil,
}

const ferryOutbox = "github.com/ferryhq/ferry/outbox"

type kind int

const (
	kPublish kind = iota + 1
	kWrite
	kCommit
	kBegin
)

// site is one matched call.
type site struct {
	kind    kind
	pos     token.Pos // position used for ordering and reporting in the analysed function
	origin  token.Pos // the matched call itself (differs from pos when found in a callee)
	what    string    // "nats.Conn.Publish"
	via     string    // callee name when found one level down
	inGo    bool
	inDefer bool
	inTxFn  bool // inside a function literal passed to a transaction helper
}

type funcInfo struct {
	name  string
	doc   *ast.CommentGroup
	lits  *[]*funcInfo // where escaping function literals become units of their own
	sites []site       // direct sites (including nested function literals)
	calls []calleeAt   // same-package callees
}

type calleeAt struct {
	fn      *types.Func
	pos     token.Pos
	inGo    bool
	inDefer bool
	inTxFn  bool
}

func run(pass *analysis.Pass) (any, error) {
	if strings.HasPrefix(pass.Pkg.Path(), "github.com/ferryhq/ferry/") || pass.Pkg.Path() == "github.com/ferryhq/ferry" {
		if !strings.Contains(pass.Pkg.Path(), "/testdata/") && !strings.Contains(pass.Pkg.Path(), "/examples/") {
			return nil, nil // Ferry's own relay publishes and marks rows by design
		}
	}
	funcs := map[*types.Func]*funcInfo{}
	var units []*funcInfo
	var objs []*types.Func
	for _, f := range pass.Files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || fd.Body == nil {
				continue
			}
			obj, _ := pass.TypesInfo.Defs[fd.Name].(*types.Func)
			if obj == nil {
				continue
			}
			var lits []*funcInfo
			fi := &funcInfo{name: fd.Name.Name, doc: fd.Doc, lits: &lits}
			collect(pass, fd.Body, fi, false, false, false)
			funcs[obj] = fi
			units = append(units, fi)
			objs = append(objs, obj)
			for _, l := range lits {
				units = append(units, l)
				objs = append(objs, nil)
			}
		}
	}
	ignored := ignoreLines(pass)
	reported := map[token.Pos]bool{}
	for i, fi := range units {
		obj := objs[i]
		all := append([]site(nil), fi.sites...)
		for _, c := range fi.calls {
			callee := funcs[c.fn]
			if callee == nil || (obj != nil && c.fn == obj) {
				continue
			}
			for _, s := range callee.sites {
				s.pos = c.pos
				s.via = c.fn.Name()
				s.inGo = s.inGo || c.inGo
				s.inDefer = s.inDefer || c.inDefer
				s.inTxFn = s.inTxFn || c.inTxFn
				all = append(all, s)
			}
		}
		sort.SliceStable(all, func(i, j int) bool { return all[i].pos < all[j].pos })
		var writes, commits, begins, pubs []site
		for _, s := range all {
			switch s.kind {
			case kPublish:
				pubs = append(pubs, s)
			case kWrite:
				writes = append(writes, s)
			case kCommit:
				commits = append(commits, s)
			case kBegin:
				begins = append(begins, s)
			}
		}
		if len(pubs) == 0 || len(writes)+len(commits) == 0 {
			continue
		}
		if hasIgnore(pass, fi.doc) {
			continue
		}
		for _, p := range pubs {
			if reported[p.pos] || ignored[lineKey(pass, p.pos)] {
				continue
			}
			reported[p.pos] = true
			pass.Report(analysis.Diagnostic{
				Pos:      p.pos,
				Category: "dualwrite",
				Message:  message(pass, fi.name, p, writes, commits, begins),
			})
		}
	}
	return nil, nil
}

func message(pass *analysis.Pass, fn string, p site, writes, commits, begins []site) string {
	pub := p.what
	if p.via != "" {
		pub = fmt.Sprintf("%s (in %s, called here)", p.what, p.via)
	}
	var db site
	if len(commits) > 0 {
		db = commits[0]
	} else {
		db = writes[0]
	}
	dbDesc := db.what
	if db.via != "" {
		dbDesc += " in " + db.via
	}
	dbAt := pass.Fset.Position(db.origin)
	dbRef := fmt.Sprintf("%s at line %d", dbDesc, dbAt.Line)
	var shape, why string
	switch {
	case p.inGo:
		shape = "in a goroutine started from " + fn
		why = "the goroutine may run before the commit, after a rollback, or never (process exit); nothing retries it"
	case p.inDefer:
		shape = "in a defer of " + fn
		why = "the defer runs on every return, including after a failed or rolled-back write, and a crash skips it"
	case p.inTxFn:
		shape = "inside the transaction"
		why = "the event is out before the transaction commits; a rollback leaves consumers with an event for a change that never happened"
	case len(commits) > 0 && p.pos < commits[0].pos && len(begins) > 0 && p.pos < begins[0].pos && (len(writes) == 0 || p.pos < writes[0].pos):
		shape = "before the transaction"
		why = "the event is out before anything is stored; a failed write leaves an event for nothing"
	case len(commits) > 0 && p.pos < commits[len(commits)-1].pos:
		shape = "before commit (inside the transaction)"
		why = "if the commit fails consumers see an event for a change that never happened"
	case len(commits) > 0:
		shape = "after commit"
		why = "if the publish fails or the process dies after the commit, the change is stored and the event is lost"
	case p.pos > db.pos:
		shape = "after the database write"
		why = "if the publish fails or the process dies after the write, the change is stored and the event is lost"
	default:
		shape = "before the database write"
		why = "if the write fails consumers see an event for a change that never happened"
	}
	return fmt.Sprintf("dual write: %s publishes %s %s (%s): %s; write the event with outbox.InsertTx in the same transaction and let the relay publish it", fn, pub, shape, dbRef, why)
}

// collect walks body, recording matched calls and same-package callees.
func collect(pass *analysis.Pass, body ast.Node, fi *funcInfo, inGo, inDefer, inTxFn bool) {
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.GoStmt:
			collectCall(pass, n.Call, fi, true, inDefer, inTxFn)
			return false
		case *ast.DeferStmt:
			collectCall(pass, n.Call, fi, inGo, true, inTxFn)
			return false
		case *ast.SendStmt:
			if isSaramaInput(pass, n.Chan) {
				fi.sites = append(fi.sites, site{kind: kPublish, pos: n.Arrow, origin: n.Arrow, what: "sarama.AsyncProducer.Input() <-", inGo: inGo, inDefer: inDefer, inTxFn: inTxFn})
			}
		case *ast.CallExpr:
			collectCall(pass, n, fi, inGo, inDefer, inTxFn)
			return false
		case *ast.FuncLit:
			// A literal that is returned or stored runs on its own path (a
			// handler factory's handler): it is a unit of its own.
			u := &funcInfo{name: "func literal in " + fi.name, doc: fi.doc, lits: fi.lits}
			collect(pass, n.Body, u, false, false, false)
			*fi.lits = append(*fi.lits, u)
			return false
		}
		return true
	})
}

func collectCall(pass *analysis.Pass, call *ast.CallExpr, fi *funcInfo, inGo, inDefer, inTxFn bool) {
	// Function literal called directly: go func(){...}(), defer func(){...}().
	if lit, ok := ast.Unparen(call.Fun).(*ast.FuncLit); ok {
		collect(pass, lit.Body, fi, inGo, inDefer, inTxFn)
	} else {
		collect(pass, call.Fun, fi, inGo, inDefer, inTxFn)
	}
	fn := calleeFunc(pass, call)
	txHelper := fn != nil && isTxHelper(fn)
	for _, a := range call.Args {
		if lit, ok := ast.Unparen(a).(*ast.FuncLit); ok {
			collect(pass, lit.Body, fi, inGo, inDefer, inTxFn || txHelper)
			continue
		}
		collect(pass, a, fi, inGo, inDefer, inTxFn)
	}
	if fn == nil {
		return
	}
	s := site{pos: call.Lparen, origin: call.Lparen, inGo: inGo, inDefer: inDefer, inTxFn: inTxFn}
	if sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr); ok {
		s.pos, s.origin = sel.Sel.Pos(), sel.Sel.Pos()
	} else {
		s.pos, s.origin = call.Pos(), call.Pos()
	}
	pkg := ""
	if fn.Pkg() != nil {
		pkg = fn.Pkg().Path()
	}
	if pkg == ferryOutbox || strings.HasPrefix(pkg, ferryOutbox+"/") {
		return // the outbox write itself
	}
	if w := matchPublish(fn); w != "" {
		s.kind, s.what = kPublish, w
		fi.sites = append(fi.sites, s)
		return
	}
	if k, w := matchDB(pass, fn, call); k != 0 {
		s.kind, s.what = k, w
		fi.sites = append(fi.sites, s)
		return
	}
	if fn.Pkg() == pass.Pkg {
		fi.calls = append(fi.calls, calleeAt{fn: fn.Origin(), pos: s.pos, inGo: inGo, inDefer: inDefer, inTxFn: inTxFn})
	}
}

func calleeFunc(pass *analysis.Pass, call *ast.CallExpr) *types.Func {
	var id *ast.Ident
	switch f := ast.Unparen(call.Fun).(type) {
	case *ast.Ident:
		id = f
	case *ast.SelectorExpr:
		id = f.Sel
	case *ast.IndexExpr:
		switch x := f.X.(type) {
		case *ast.Ident:
			id = x
		case *ast.SelectorExpr:
			id = x.Sel
		}
	case *ast.IndexListExpr:
		switch x := f.X.(type) {
		case *ast.Ident:
			id = x
		case *ast.SelectorExpr:
			id = x.Sel
		}
	}
	if id == nil {
		return nil
	}
	fn, _ := pass.TypesInfo.Uses[id].(*types.Func)
	if fn == nil {
		return nil
	}
	return fn.Origin()
}

// recvName is the name of fn's receiver type (pointer and instantiation
// stripped), or "" for a plain function.
func recvName(fn *types.Func) string {
	sig, ok := fn.Type().(*types.Signature)
	if !ok || sig.Recv() == nil {
		return ""
	}
	t := sig.Recv().Type()
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	switch t := t.(type) {
	case *types.Named:
		return t.Obj().Name()
	case *types.Alias:
		return t.Obj().Name()
	}
	return ""
}

type publishRule struct {
	pkg      string
	recv     string // "" = any receiver
	prefixes []string
	label    string
}

var publishRules = []publishRule{
	{"github.com/nats-io/nats.go", "", []string{"Publish"}, "nats"},
	{"github.com/nats-io/nats.go/jetstream", "", []string{"Publish"}, "jetstream"},
	{"github.com/twmb/franz-go/pkg/kgo", "Client", []string{"Produce", "TryProduce"}, "kgo"},
	{"github.com/rabbitmq/amqp091-go", "Channel", []string{"Publish"}, "amqp"},
	{"github.com/streadway/amqp", "Channel", []string{"Publish"}, "amqp"},
	{"github.com/IBM/sarama", "", []string{"SendMessage"}, "sarama"},
	{"github.com/Shopify/sarama", "", []string{"SendMessage"}, "sarama"},
	{"github.com/segmentio/kafka-go", "", []string{"WriteMessages", "WriteCompressedMessages", "Produce"}, "kafka"},
	{"github.com/ThreeDotsLabs/watermill/message", "Publisher", []string{"Publish"}, "watermill"},
	{"github.com/aws/aws-sdk-go-v2/service/sns", "Client", []string{"Publish"}, "sns"},
	{"github.com/aws/aws-sdk-go-v2/service/sqs", "Client", []string{"SendMessage"}, "sqs"},
	{"github.com/aws/aws-sdk-go/service/sns", "SNS", []string{"Publish"}, "sns"},
	{"github.com/aws/aws-sdk-go/service/sqs", "SQS", []string{"SendMessage"}, "sqs"},
	{"cloud.google.com/go/pubsub", "Topic", []string{"Publish"}, "pubsub"},
	{"cloud.google.com/go/pubsub/v2", "Publisher", []string{"Publish"}, "pubsub"},
}

// matchPublish returns a label such as "nats.Conn.Publish" when fn is a
// broker publish.
func matchPublish(fn *types.Func) string {
	if fn.Pkg() == nil {
		return ""
	}
	pkg, name, recv := fn.Pkg().Path(), fn.Name(), recvName(fn)
	if recv == "" && !isMethod(fn) {
		return ""
	}
	for _, r := range publishRules {
		if r.pkg != pkg || (r.recv != "" && r.recv != recv) {
			continue
		}
		for _, p := range r.prefixes {
			if strings.HasPrefix(name, p) {
				return label(r.label, recv, name)
			}
		}
	}
	return ""
}

func isMethod(fn *types.Func) bool {
	sig, ok := fn.Type().(*types.Signature)
	return ok && sig.Recv() != nil
}

func label(pkg, recv, name string) string {
	if recv == "" {
		return pkg + "." + name
	}
	return pkg + "." + recv + "." + name
}

func isTxHelper(fn *types.Func) bool {
	if fn.Pkg() == nil {
		return false
	}
	switch fn.Pkg().Path() {
	case "github.com/jackc/pgx/v5", "github.com/jackc/pgx/v4":
		return fn.Name() == "BeginFunc" || fn.Name() == "BeginTxFunc"
	case "gorm.io/gorm":
		return fn.Name() == "Transaction"
	}
	return false
}

// matchDB classifies a database call.
func matchDB(pass *analysis.Pass, fn *types.Func, call *ast.CallExpr) (kind, string) {
	if fn.Pkg() == nil || !isMethod(fn) {
		if fn.Pkg() != nil && isTxHelper(fn) {
			return kBegin, fn.Pkg().Name() + "." + fn.Name()
		}
		// sqlx's package-level helpers take the Execer as an argument.
		if fn.Pkg() != nil && fn.Pkg().Path() == "github.com/jmoiron/sqlx" &&
			(strings.HasPrefix(fn.Name(), "NamedExec") || strings.HasPrefix(fn.Name(), "MustExec")) {
			return kWrite, "sqlx." + fn.Name()
		}
		return 0, ""
	}
	pkg, name, recv := fn.Pkg().Path(), fn.Name(), recvName(fn)
	lbl := label(fn.Pkg().Name(), recv, name)
	switch pkg {
	case "database/sql", "github.com/jackc/pgx/v5", "github.com/jackc/pgx/v5/pgxpool", "github.com/jackc/pgx/v4", "github.com/jackc/pgx/v4/pgxpool":
		switch {
		case name == "Commit":
			return kCommit, lbl
		case name == "Begin" || name == "BeginTx":
			return kBegin, lbl
		case name == "Exec" || name == "ExecContext":
			if sqlReads(pass, call, pkg) {
				return 0, ""
			}
			return kWrite, lbl
		case strings.HasPrefix(name, "Query"):
			if sqlWritesConst(pass, call, pkg) {
				return kWrite, lbl
			}
			return 0, ""
		case name == "CopyFrom" || name == "SendBatch":
			return kWrite, lbl
		}
		return 0, ""
	case "github.com/jmoiron/sqlx":
		if strings.HasPrefix(name, "NamedExec") || strings.HasPrefix(name, "MustExec") {
			return kWrite, lbl
		}
		switch name {
		case "Commit":
			return kCommit, lbl
		case "Beginx", "BeginTxx", "MustBegin", "MustBeginTx":
			return kBegin, lbl
		}
		return 0, ""
	case "gorm.io/gorm":
		switch name {
		case "Create", "CreateInBatches", "Save", "Update", "Updates", "UpdateColumn", "UpdateColumns", "Delete", "Exec":
			return kWrite, lbl
		case "Commit":
			return kCommit, lbl
		case "Begin":
			return kBegin, lbl
		}
		return 0, ""
	}
	// ent: generated builders.
	if name == "Save" || name == "SaveX" || name == "Exec" || name == "ExecX" {
		for _, suf := range []string{"Create", "CreateBulk", "Update", "UpdateOne", "Delete", "DeleteOne"} {
			if strings.HasSuffix(recv, suf) && importsEnt(fn.Pkg()) {
				return kWrite, lbl
			}
		}
	}
	// Any Exec-shaped method: first result database/sql.Result or pgconn.CommandTag.
	if sig, ok := fn.Type().(*types.Signature); ok && sig.Results().Len() > 0 {
		if n, ok := types.Unalias(sig.Results().At(0).Type()).(*types.Named); ok && n.Obj().Pkg() != nil {
			p, o := n.Obj().Pkg().Path(), n.Obj().Name()
			if (p == "database/sql" && o == "Result") || (strings.HasPrefix(p, "github.com/jackc/pgx/") && o == "CommandTag") {
				if sqlReads(pass, call, "") {
					return 0, ""
				}
				return kWrite, lbl
			}
		}
	}
	return 0, ""
}

func importsEnt(p *types.Package) bool {
	for _, imp := range p.Imports() {
		if imp.Path() == "entgo.io/ent" || strings.HasPrefix(imp.Path(), "entgo.io/ent/") {
			return true
		}
	}
	return false
}

// sqlArg returns the constant SQL text of call, if the first string argument
// is a constant.
func sqlArg(pass *analysis.Pass, call *ast.CallExpr) (string, bool) {
	for _, a := range call.Args {
		tv, ok := pass.TypesInfo.Types[a]
		if !ok {
			continue
		}
		b, ok := tv.Type.Underlying().(*types.Basic)
		if !ok || b.Info()&types.IsString == 0 {
			continue
		}
		if tv.Value != nil && tv.Value.Kind() == constant.String {
			return constant.StringVal(tv.Value), true
		}
		return "", false
	}
	return "", false
}

var writeVerbs = []string{"INSERT", "UPDATE", "DELETE", "MERGE", "UPSERT", "REPLACE", "CREATE", "ALTER", "DROP", "TRUNCATE", "COPY", "CALL"}

func sqlIsWrite(q string) bool {
	u := strings.ToUpper(q)
	first := strings.Fields(u)
	if len(first) == 0 {
		return false
	}
	for _, v := range writeVerbs {
		if first[0] == v {
			return true
		}
	}
	if first[0] == "WITH" {
		for _, v := range []string{"INSERT ", "UPDATE ", "DELETE ", "MERGE "} {
			if strings.Contains(u, v) {
				return true
			}
		}
	}
	return false
}

// sqlReads: the SQL is a constant that does not write.
func sqlReads(pass *analysis.Pass, call *ast.CallExpr, _ string) bool {
	q, ok := sqlArg(pass, call)
	return ok && !sqlIsWrite(q)
}

// sqlWritesConst: the SQL is a constant write statement.
func sqlWritesConst(pass *analysis.Pass, call *ast.CallExpr, _ string) bool {
	q, ok := sqlArg(pass, call)
	return ok && sqlIsWrite(q)
}

func isSaramaInput(pass *analysis.Pass, ch ast.Expr) bool {
	call, ok := ast.Unparen(ch).(*ast.CallExpr)
	if !ok {
		return false
	}
	fn := calleeFunc(pass, call)
	if fn == nil || fn.Pkg() == nil || fn.Name() != "Input" {
		return false
	}
	p := fn.Pkg().Path()
	return p == "github.com/IBM/sarama" || p == "github.com/Shopify/sarama"
}

const directive = "//ferry:ignore dualwrite"

type lineID struct {
	file string
	line int
}

func lineKey(pass *analysis.Pass, pos token.Pos) lineID {
	p := pass.Fset.Position(pos)
	return lineID{p.Filename, p.Line}
}

// ignoreLines returns the lines a directive with a reason covers (its own
// line and the next). A directive without a reason is reported.
func ignoreLines(pass *analysis.Pass) map[lineID]bool {
	out := map[lineID]bool{}
	for _, f := range pass.Files {
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				if !strings.HasPrefix(c.Text, directive) {
					continue
				}
				if reason(c.Text) == "" {
					pass.Reportf(c.Pos(), "ferry:ignore dualwrite needs a reason after it (why this dual write is acceptable)")
					continue
				}
				k := lineKey(pass, c.Pos())
				out[k] = true
				out[lineID{k.file, k.line + 1}] = true
			}
		}
	}
	return out
}

func hasIgnore(_ *analysis.Pass, doc *ast.CommentGroup) bool {
	if doc == nil {
		return false
	}
	for _, c := range doc.List {
		if strings.HasPrefix(c.Text, directive) && reason(c.Text) != "" {
			return true
		}
	}
	return false
}

// reason is the text after the directive, up to a following "//" comment.
func reason(text string) string {
	r := strings.TrimPrefix(text, directive)
	if i := strings.Index(r, "//"); i >= 0 {
		r = r[:i]
	}
	return strings.TrimSpace(r)
}
