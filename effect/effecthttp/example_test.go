package effecthttp_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/ferryhq/ferry/effect"
	"github.com/ferryhq/ferry/effect/effecthttp"
)

// A payment API client: the charge carries the intent's key, and the
// reconciliation query looks the key up.
func Example() {
	charged := map[string]string{} // idempotency key → charge id
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodPost:
			key := r.Header.Get("Idempotency-Key")
			if _, ok := charged[key]; !ok {
				charged[key] = fmt.Sprintf("ch_%d", len(charged)+1)
			}
			w.Header().Set("X-Charge-Id", charged[key])
			w.WriteHeader(http.StatusCreated)
		case http.MethodGet:
			id, ok := charged[r.URL.Query().Get("idempotency_key")]
			if !ok {
				http.NotFound(w, r)
				return
			}
			w.Header().Set("X-Charge-Id", id)
		}
	}))
	defer api.Close()
	transport := &http.Transport{}
	defer transport.CloseIdleConnections()

	c, err := effecthttp.New(func(ctx context.Context, in effect.Intent) (*http.Request, error) {
		return http.NewRequestWithContext(ctx, http.MethodPost, api.URL+"/charges", strings.NewReader(string(in.Request)))
	},
		effecthttp.WithHTTPClient(&http.Client{Transport: transport}),
		effecthttp.WithStatusURL(api.URL+"/charges?idempotency_key={key}"),
		effecthttp.WithOperationIDHeader("X-Charge-Id"),
	)
	if err != nil {
		log.Fatal(err)
	}
	in := effect.Intent{Key: "fx1_example", Request: []byte(`{"amount":100}`)}
	ctx := context.Background()

	st, _ := c.Status(ctx, in)
	fmt.Println("before:", st.Lookup)
	res, err := c.Execute(ctx, in)
	fmt.Println("execute:", res.OperationID, res.Summary, err)
	st, _ = c.Status(ctx, in)
	fmt.Println("after:", st.Lookup, st.OperationID)
	// Output:
	// before: not_found
	// execute: ch_1 http 201 op=ch_1 <nil>
	// after: found ch_1
}
