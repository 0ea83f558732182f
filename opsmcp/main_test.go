package opsmcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.uber.org/goleak"

	"github.com/ferryhq/ferry/internal/testenv"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	if code == 0 {
		if err := goleak.Find(testenv.KnownLibraryLeaks()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	buildOnce sync.Once
	binDir    string
	binPath   string
	buildErr  error
)

// ferryBinary builds cmd/ferry once per test run.
func ferryBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "ferry-mcp-test")
		if buildErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "ferry")
		out, err := exec.Command("go", "build", "-o", binPath, "github.com/ferryhq/ferry/cmd/ferry").CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func newClient() *mcp.Client {
	return mcp.NewClient(&mcp.Implementation{Name: "ferry-test-agent", Version: "1"}, nil)
}

// call calls a tool, checks its output against the tool's declared output
// schema (with the SDK's own validator, jsonschema-go), and decodes it.
func call[T any](t *testing.T, cs *mcp.ClientSession, tools map[string]*mcp.Tool, name string, args map[string]any) (T, *mcp.CallToolResult) {
	t.Helper()
	var out T
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	if res.IsError {
		return out, res
	}
	tool := tools[name]
	if tool == nil || tool.OutputSchema == nil {
		t.Fatalf("tool %s declares no output schema", name)
	}
	validateOutput(t, tool, res.StructuredContent)
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("decode %s: %v", name, err)
	}
	return out, res
}

func validateOutput(t *testing.T, tool *mcp.Tool, v any) {
	t.Helper()
	sb, err := json.Marshal(tool.OutputSchema)
	if err != nil {
		t.Fatal(err)
	}
	var s jsonschema.Schema
	if err := json.Unmarshal(sb, &s); err != nil {
		t.Fatalf("%s output schema: %v", tool.Name, err)
	}
	rs, err := s.Resolve(nil)
	if err != nil {
		t.Fatalf("%s output schema: %v", tool.Name, err)
	}
	vb, _ := json.Marshal(v)
	var inst any
	_ = json.Unmarshal(vb, &inst)
	if err := rs.Validate(inst); err != nil {
		t.Fatalf("%s output does not validate against its declared schema: %v\n%s", tool.Name, err, vb)
	}
}

func errText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

func listTools(t *testing.T, cs *mcp.ClientSession) map[string]*mcp.Tool {
	t.Helper()
	res, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]*mcp.Tool{}
	for _, tl := range res.Tools {
		if tl.InputSchema == nil || tl.Description == "" {
			t.Fatalf("tool %s lacks an input schema or a description", tl.Name)
		}
		m[tl.Name] = tl
	}
	return m
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}
