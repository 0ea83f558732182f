package effect_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/uuid"

	"github.com/ferryhq/ferry"
	"github.com/ferryhq/ferry/driver/sqlite"
	"github.com/ferryhq/ferry/effect"
	"github.com/ferryhq/ferry/effect/effecthttp"
	"github.com/ferryhq/ferry/migrate"
)

// A consumer handler records a charge as an intent in its own transaction;
// the worker executes it with the derived idempotency key, and the ledger
// row is the evidence.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "ferry-effect-example")
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(filepath.Join(dir, "app.db"))
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	drv := sqlite.New(db)
	if _, err := migrate.Up(ctx, drv, ferry.Tables{}); err != nil {
		log.Fatal(err)
	}

	// A payment API that honours Idempotency-Key.
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Charge-Id", "ch_42")
		w.WriteHeader(http.StatusCreated)
	}))
	defer api.Close()
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()

	ledger, err := effect.NewLedger(drv)
	if err != nil {
		log.Fatal(err)
	}

	// Inside the consumer's transaction (the inbox hands it to the handler):
	eventID := uuid.MustParse("01890f4e-7d1c-7cc0-8a3b-6c2f1e0b9a55")
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		log.Fatal(err)
	}
	key, err := ledger.RecordTx(ctx, tx, effect.Intent{
		Consumer: "billing", EventID: eventID, Step: "charge",
		Target: "payments", Operation: "charge", Request: []byte(`{"order":"o1","amount":100}`),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		log.Fatal(err)
	}

	payments, err := effecthttp.New(func(ctx context.Context, in effect.Intent) (*http.Request, error) {
		return http.NewRequestWithContext(ctx, http.MethodPost, api.URL+"/charges", strings.NewReader(string(in.Request)))
	},
		effecthttp.WithHTTPClient(&http.Client{Transport: transport}),
		effecthttp.WithStatusURL(api.URL+"/charges?idempotency_key={key}"),
		effecthttp.WithOperationIDHeader("X-Charge-Id"),
	)
	if err != nil {
		log.Fatal(err)
	}
	worker, err := effect.NewWorker(ledger, payments, payments, effect.WithLogger(quiet))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := worker.Work(ctx); err != nil { // production code runs worker.Run(ctx)
		log.Fatal(err)
	}

	recs, err := effect.ByEvent(ctx, drv.Executor(), ferry.Tables{}, eventID)
	if err != nil {
		log.Fatal(err)
	}
	r := recs[0]
	fmt.Println(r.Key == key, r.Consumer, r.Step, r.State, r.OperationID, r.Attempts, r.ResponseSummary)
	// Output:
	// true billing charge succeeded ch_42 1 http 201 op=ch_42
}

// The key is a pure function of (consumer, event id, step).
func ExampleKey() {
	fmt.Println(effect.Key("billing", uuid.MustParse("01890f4e-7d1c-7cc0-8a3b-6c2f1e0b9a55"), "charge"))
	// Output:
	// fx1_dfaa16b90193933900bac728624d7c169fec193f262e92b69b99a5967f53cf4a
}
