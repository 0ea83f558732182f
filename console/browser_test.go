package console_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/broker/natsjs"
	"github.com/ferryhq/ferry/broker/natsjs/natsembed"
	"github.com/ferryhq/ferry/console"
	"github.com/ferryhq/ferry/driver/pgxv5"
	"github.com/ferryhq/ferry/inbox"
	"github.com/ferryhq/ferry/internal/testenv"
	"github.com/ferryhq/ferry/relay"
)

// chromium finds Debian's chromium (or $FERRY_CHROMIUM).
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("FERRY_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	testenv.Unavailable(t, "no chromium on PATH (apt-get install chromium; .ci/run installs it)")
	return ""
}

// browser starts a headless chromium with a fresh profile; cancel ends it.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := chromium(t)
	opts := append([]chromedp.ExecAllocatorOption{}, chromedp.DefaultExecAllocatorOptions[:]...)
	opts = append(opts, chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-background-networking", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start chromium %s: %v", path, err)
	}
	return ctx
}

// screenshot writes docs/img/console-<name>.png when FERRY_UPDATE_SCREENSHOTS=1.
func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	if os.Getenv("FERRY_UPDATE_SCREENSHOTS") != "1" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join("..", "docs", "img", "console-"+name+".png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
}

func waitJS(t *testing.T, ctx context.Context, what, expr string) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(20*time.Second), chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		body, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body.innerText`))
		t.Fatalf("waiting for %s (%s): %v\npage text:\n%s", what, expr, err, body)
	}
}

func evalJS[T any](t *testing.T, ctx context.Context, expr string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

func do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	if err := chromedp.Do(ctx, steps...); err != nil {
		t.Fatal(err)
	}
}

func bodyHas(s string) string { return fmt.Sprintf(`document.body.innerText.includes(%q)`, s) }

// signIn stores the token in the tab's sessionStorage (what the sign-in
// box does) and opens path.
func signIn(t *testing.T, ctx context.Context, base, token, path string) {
	t.Helper()
	do(t, ctx, chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#token")))
	do(t, ctx, chromedp.SendKeys(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS("#login-btn")))
	// The button stores the token and reloads; open the page after it.
	do(t, ctx, chromedp.Sleep(500*time.Millisecond), chromedp.Navigate(base+path))
	waitJS(t, ctx, "signed in", `document.querySelector('#identity') !== null`)
}

const xssAggregate = `<img src=x onerror="window.__xss=1">`
const xssError = `<script>window.__xss=2</script>broker rejected`
const xssPayload = `{"note":"<script>window.__xss=3</script>"}`

// The console in a real browser, over a Postgres database with a running
// relay (embedded JetStream) and two inbox consumers.
func TestBrowserConsole(t *testing.T) {
	chromium(t)
	ctx := context.Background()
	e := newEnv(t, "postgres", console.Config{})
	drv := pgxv5.New(e.pg.Pool)

	// Backlog the relay cannot drain: ledger.events has no stream (the
	// relay holds such rows as a missing destination).
	var backlog []ferry.Event
	for i := range 20 {
		ev := event(fmt.Sprintf("l-%d", i), "ledger.posted")
		ev.AggregateType = "ledger"
		backlog = append(backlog, ev)
	}
	e.insert(t, backlog...)
	// Two dead letters (written before the relay runs): one to retry, one
	// full of markup.
	deadOne := e.insert(t, event("d-1", "order.created"))[0]
	xss := event(xssAggregate, "order.created")
	xss.Payload = []byte(xssPayload)
	xssEv := e.insert(t, xss)[0]
	markDead(t, e, "broker rejected: schema (fixed in v2.3)", deadOne.ID.String())
	markDead(t, e, xssError, xssEv.ID.String())
	// Events both consumers apply.
	var applied []ferry.Event
	for i := range 3 {
		applied = append(applied, event(fmt.Sprintf("o-%d", i), "order.created"))
	}
	applied = e.insert(t, applied...)

	emb, err := natsembed.Start(natsembed.WithStoreDir(t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emb.Close() })
	nc, err := natsjs.Connect(emb.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := natsjs.EnsureStream(ctx, js, natsjs.StreamConfig{Name: "ORDERS", Subjects: []string{"order.events"}}); err != nil {
		t.Fatal(err)
	}
	pub, err := natsjs.NewPublisher(nc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	r, err := relay.New(drv, pub, relay.WithShardCount(4), relay.WithPollInterval(20*time.Millisecond),
		relay.WithRegisterer(prometheus.NewRegistry()), relay.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() { relayDone <- r.Run(rctx) }()
	t.Cleanup(func() {
		stopRelay()
		if err := <-relayDone; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("relay: %v", err)
		}
	})
	for _, name := range []string{"billing", "shipping"} {
		ib, err := inbox.New(drv, name, func(context.Context, pgx.Tx, ferry.Event) error { return nil },
			inbox.WithRegisterer(prometheus.NewRegistry()), inbox.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		cons, err := natsjs.NewConsumer(ctx, nc, "ORDERS", name)
		if err != nil {
			t.Fatal(err)
		}
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- ib.Run(cctx, cons) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
				t.Errorf("inbox %s: %v", name, err)
			}
			_ = cons.Close()
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for count(t, e, `SELECT count(*) FROM ferry_inbox`) < 6 {
		if time.Now().After(deadline) {
			t.Fatalf("consumers applied %d of 6", count(t, e, `SELECT count(*) FROM ferry_inbox`))
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A poison-parked message and a failed effect intent, their error
	// texts and payloads full of markup.
	parkedID, effectID := seedDetailRows(t, e, applied[0])

	base := e.srv.URL
	bctx := browser(t)

	// Overview with the real backlog; it names when it was read.
	signIn(t, bctx, base, operatorToken, "/")
	waitJS(t, bctx, "overview read", `(document.querySelector('#read-at')||{}).textContent?.includes('Read from the database at')`)
	waitJS(t, bctx, "backlog topic", bodyHas("ledger.events"))
	waitJS(t, bctx, "consumers", bodyHas("billing")+" && "+bodyHas("shipping"))
	firstRead := evalJS[string](t, bctx, `document.querySelector('#read-at').textContent`)
	screenshot(t, bctx, "overview")
	waitJS(t, bctx, "auto refresh", fmt.Sprintf(`document.querySelector('#read-at').textContent !== %q`, firstRead))

	// Dead letters: the markup renders as text and runs nothing.
	do(t, bctx, chromedp.Navigate(base+"/dead"))
	waitJS(t, bctx, "dead letters listed", bodyHas(deadOne.ID.String())+" && "+bodyHas(xssError)+" && "+bodyHas(xssAggregate))
	if n := evalJS[int](t, bctx, `document.querySelectorAll('main img, main script').length + (window.__xss === undefined ? 0 : 100)`); n != 0 {
		t.Fatalf("markup from data became elements or ran: %d", n)
	}
	screenshot(t, bctx, "dead-letters")

	// Find the dead letter, preview a retry (nothing changes), approve with a reason.
	do(t, bctx, chromedp.SendKeys(chromedp.CSS(`input[name="event_ids"]`), deadOne.ID.String()), chromedp.Click(chromedp.CSS(`form.filters button[type="submit"]`)))
	waitJS(t, bctx, "filtered", bodyHas("1 matching in total"))
	before := snapshot(t, e, "ferry_ops_audit")
	do(t, bctx, chromedp.Click(chromedp.CSS("#preview-btn")))
	waitJS(t, bctx, "preview", `(document.querySelector('#preview-count')||{}).textContent?.includes('1 row(s)')`)
	if got := count(t, e, `SELECT count(*) FROM ferry_outbox WHERE event_id = $1 AND status = 'dead'`, deadOne.ID.String()); got != 1 || snapshot(t, e, "ferry_ops_audit") != before {
		t.Fatal("the preview changed rows")
	}
	screenshot(t, bctx, "retry-preview")
	do(t, bctx, chromedp.Click(chromedp.CSS("#approve-btn")))
	waitJS(t, bctx, "reason required", bodyHas("a reason is required")+" && "+bodyHas("reason"))
	do(t, bctx, chromedp.SendKeys(chromedp.CSS("#reason"), "schema fixed in v2.3 (INC-42)"), chromedp.Click(chromedp.CSS("#approve-btn")))
	waitJS(t, bctx, "retried", `(document.querySelector('#action-done')||{}).textContent?.includes('changed 1 row(s)')`)
	screenshot(t, bctx, "retry-done")
	// The running relay sends it.
	deadline = time.Now().Add(30 * time.Second)
	for count(t, e, `SELECT count(*) FROM ferry_outbox WHERE event_id = $1 AND status = 'sent'`, deadOne.ID.String()) != 1 {
		if time.Now().After(deadline) {
			t.Fatal("the retried dead letter was not sent by the relay")
		}
		time.Sleep(50 * time.Millisecond)
	}
	do(t, bctx, chromedp.Navigate(base+"/message?event_id="+deadOne.ID.String()))
	waitJS(t, bctx, "message shows sent", `[...document.querySelectorAll('td')].some(td => td.textContent === 'sent')`)
	// The audit row appears, with the token's identity.
	do(t, bctx, chromedp.Navigate(base+"/audit"))
	waitJS(t, bctx, "audit row", bodyHas("dlq.retry")+" && "+bodyHas("olivia")+" && "+bodyHas("schema fixed in v2.3 (INC-42)"))
	screenshot(t, bctx, "audit")

	// Revealing a payload is an explicit, audited action; the payload
	// shows as text.
	do(t, bctx, chromedp.Navigate(base+"/message?event_id="+xssEv.ID.String()))
	waitJS(t, bctx, "message", bodyHas("Hidden ("))
	if evalJS[bool](t, bctx, bodyHas("window.__xss=3")) {
		t.Fatal("payload shown before reveal")
	}
	do(t, bctx, chromedp.SendKeys(chromedp.CSS("#reveal-reason"), "customer asked what we sent (TICKET-9)"), chromedp.Click(chromedp.CSS("#reveal-btn")))
	waitJS(t, bctx, "payload revealed as text", `(document.querySelector('#payload-text')||{}).textContent === `+fmt.Sprintf("%q", xssPayload))
	if n := evalJS[int](t, bctx, `document.querySelectorAll('main img, main script').length + (window.__xss === undefined ? 0 : 100)`); n != 0 {
		t.Fatalf("payload markup ran: %d", n)
	}
	screenshot(t, bctx, "message")
	if n := count(t, e, `SELECT count(*) FROM ferry_ops_audit WHERE action = 'outbox.reveal_payload' AND actor = 'olivia'`); n != 1 {
		t.Fatalf("reveal audit rows %d", n)
	}

	// Outbox search: an aggregate in sequence order.
	do(t, bctx, chromedp.Navigate(base+"/outbox?tenant_id=acme&aggregate_type=order&aggregate_id=o-1"))
	waitJS(t, bctx, "aggregate search", bodyHas("in sequence order")+" && "+bodyHas(applied[1].ID.String()))
	screenshot(t, bctx, "outbox")

	// Evidence of an event both consumers applied: both, from the inbox table.
	do(t, bctx, chromedp.Navigate(base+"/evidence?q="+applied[0].ID.String()))
	waitJS(t, bctx, "evidence", bodyHas("applied by consumer billing")+" && "+bodyHas("applied by consumer shipping")+" && "+bodyHas("ferry_inbox")+" && "+bodyHas("ferry_outbox"))
	screenshot(t, bctx, "evidence")
	for _, p := range []string{"parked", "effects", "cleanup"} {
		do(t, bctx, chromedp.Navigate(base+"/"+p))
		waitJS(t, bctx, p, `document.querySelector('#identity') !== null`)
		screenshot(t, bctx, p)
	}

	// Detail views: from the parked list to the parked message (its error
	// as text, payload hidden until an audited reveal), and an effect
	// intent with its attempts and receipt.
	noMarkup := `document.querySelectorAll('main img, main script, main b').length + (window.__xss === undefined ? 0 : 100)`
	do(t, bctx, chromedp.Navigate(base+"/parked?consumer=billing"))
	waitJS(t, bctx, "parked list links the row", fmt.Sprintf(`document.querySelector('a[href="/parked-message?id=%d"]') !== null`, parkedID))
	// Follow the row's link (navigating, not clicking: a click's page
	// change races the next poll's execution context).
	do(t, bctx, chromedp.Navigate(base+evalJS[string](t, bctx, fmt.Sprintf(`document.querySelector('a[href="/parked-message?id=%d"]').getAttribute('href')`, parkedID))))
	waitJS(t, bctx, "parked detail", `(document.querySelector('#f-last_error')||{}).textContent === 'handler panicked: <img src=x onerror="window.__xss=1">'`+
		` && `+bodyHas("Hidden (")+` && `+bodyHas("Evidence for this event"))
	if evalJS[bool](t, bctx, bodyHas("window.__xss=2")) {
		t.Fatal("parked payload shown before reveal")
	}
	do(t, bctx, chromedp.SendKeys(chromedp.CSS("#reveal-reason"), "why did billing park it (INC-43)"), chromedp.Click(chromedp.CSS("#reveal-btn")))
	waitJS(t, bctx, "parked payload revealed as text", `(document.querySelector('#payload-text')||{}).textContent === '{"note":"<script>window.__xss=2</script>"}'`)
	if n := evalJS[int](t, bctx, noMarkup); n != 0 {
		t.Fatalf("parked detail markup became elements or ran: %d", n)
	}
	screenshot(t, bctx, "parked-message")
	do(t, bctx, chromedp.Navigate(base+"/effects"))
	waitJS(t, bctx, "effects list links the row", fmt.Sprintf(`document.querySelector('a[href="/effect?id=%d"]') !== null`, effectID))
	// Follow the row's link (navigating, not clicking: a click's page
	// change races the next poll's execution context).
	do(t, bctx, chromedp.Navigate(base+evalJS[string](t, bctx, fmt.Sprintf(`document.querySelector('a[href="/effect?id=%d"]').getAttribute('href')`, effectID))))
	waitJS(t, bctx, "effect detail", `(document.querySelector('#f-last_error')||{}).textContent === 'psp said <b onmouseover="window.__xss=4">no</b>'`+
		` && document.querySelector('#f-operation_id').textContent === 'op-77' && document.querySelector('#f-attempts').textContent === '4'`+
		` && document.querySelector('#f-state').textContent === 'failed' && `+bodyHas("Hidden ("))
	do(t, bctx, chromedp.SendKeys(chromedp.CSS("#reveal-reason"), "what did we ask the PSP (INC-43)"), chromedp.Click(chromedp.CSS("#reveal-btn")))
	waitJS(t, bctx, "effect request revealed as text", `(document.querySelector('#payload-text')||{}).textContent === '{"amount":100,"memo":"<script>window.__xss=3</script>"}'`)
	if n := evalJS[int](t, bctx, noMarkup); n != 0 {
		t.Fatalf("effect detail markup became elements or ran: %d", n)
	}
	screenshot(t, bctx, "effect")
	for action, reason := range map[string]string{"parked.reveal_payload": "why did billing park it (INC-43)", "effects.reveal_request": "what did we ask the PSP (INC-43)"} {
		if n := count(t, e, `SELECT count(*) FROM ferry_ops_audit WHERE action = $1 AND actor = 'olivia' AND reason = $2`, action, reason); n != 1 {
			t.Fatalf("%s audit rows %d", action, n)
		}
	}

	// A viewer (own tab, own sessionStorage) sees no action buttons, and a
	// POST forged with the viewer's token is refused.
	vctx, cancelV := chromedp.NewContext(bctx)
	defer cancelV()
	signIn(t, vctx, base, viewerToken, "/dead")
	waitJS(t, vctx, "viewer list", bodyHas(xssError)+` && document.querySelector('#no-actions') !== null`)
	if n := evalJS[int](t, vctx, `document.querySelectorAll('#preview-btn, #approve-btn, #actions').length`); n != 0 {
		t.Fatalf("viewer sees %d action controls", n)
	}
	do(t, vctx, chromedp.Navigate(base+"/message?event_id="+xssEv.ID.String()))
	waitJS(t, vctx, "viewer message", bodyHas("Hidden ("))
	if n := evalJS[int](t, vctx, `document.querySelectorAll('#reveal-btn').length`); n != 0 {
		t.Fatal("viewer sees the reveal button")
	}
	for _, p := range []string{fmt.Sprintf("/parked-message?id=%d", parkedID), fmt.Sprintf("/effect?id=%d", effectID)} {
		do(t, vctx, chromedp.Navigate(base+p))
		waitJS(t, vctx, "viewer detail "+p, bodyHas("Hidden (")+` && document.querySelector('#f-last_error') !== null`)
		if n := evalJS[int](t, vctx, `document.querySelectorAll('#reveal-btn, #reveal-reason, #actions, #preview-btn, #approve-btn').length`); n != 0 {
			t.Fatalf("viewer sees %d action controls on %s", n, p)
		}
		if n := evalJS[int](t, vctx, noMarkup); n != 0 {
			t.Fatalf("viewer detail %s: markup became elements or ran: %d", p, n)
		}
	}
	status := evalJS[int](t, vctx, fmt.Sprintf(`fetch('/api/v1/dead/retry', {method: 'POST', headers: {'Authorization': 'Bearer %s', 'Content-Type': 'application/json'},
		body: JSON.stringify({filter: {all: true}, approve: true, reason: 'forged'})}).then(r => r.status)`, viewerToken))
	if status != http.StatusForbidden {
		t.Fatalf("forged viewer POST: %d", status)
	}
	screenshot(t, vctx, "dead-letters-viewer")

	// A page of another origin posting a form to the console is refused
	// by the cross-origin check (even though it needs no token to try).
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = io.WriteString(w, `<form id="f" method="POST" enctype="text/plain" action="`+base+`/api/v1/dead/retry"><input name='{"filter":{"all":true},"approve":true,"reason":"x","a":"' value='"}'></form><script>document.getElementById('f').submit()</script>`)
	}))
	defer evil.Close()
	do(t, vctx, chromedp.Navigate(evil.URL))
	waitJS(t, vctx, "cross-site form refused", bodyHas("cross-origin request refused"))
	if n := count(t, e, `SELECT count(*) FROM ferry_outbox WHERE event_id = $1 AND status = 'dead'`, xssEv.ID.String()); n != 1 {
		t.Fatal("a refused request changed the dead letter")
	}
	if n := count(t, e, `SELECT count(*) FROM ferry_ops_audit`); n != 4 {
		t.Fatalf("audit rows %d, want 4 (the retry and the three reveals)", n)
	}
	if strings.Contains(snapshot(t, e, "ferry_ops_audit"), "forged") {
		t.Fatal("a forged request was audited as an action")
	}
}
