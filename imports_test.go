package ferry_test

import (
	"os/exec"
	"strings"
	"testing"
)

// Users link only what they use: each package below must not pull in the
// heavy or optional clients listed for it (franz-go keeps kfake apart, river
// keeps SQLite in its own driver). Measured with the go tool itself.
func TestImportsStayLight(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("go tool not on PATH: cannot list dependencies")
	}
	cases := []struct {
		pkg       string
		forbidden []string
	}{
		{"./broker/natsjs", []string{"github.com/nats-io/nats-server"}},
		{"./driver/databasesql", []string{"modernc.org/sqlite", "github.com/jackc/pgx", "github.com/go-sql-driver/mysql"}},
		{"./driver/sqlite", []string{"github.com/jackc/pgx", "github.com/go-sql-driver/mysql"}},
		{"./driver/pgxv5", []string{"modernc.org/sqlite", "github.com/go-sql-driver/mysql"}},
		{"./outbox", []string{"modernc.org/sqlite", "github.com/jackc/pgx", "github.com/nats-io", "github.com/twmb/franz-go", "github.com/rabbitmq", "gocloud.dev"}},
		{"./inbox", []string{"modernc.org/sqlite", "github.com/nats-io/nats-server", "github.com/twmb/franz-go/pkg/kfake", "gocloud.dev"}},
		// The archive's blob client lives in package archive, not in ops.
		{"./ops", []string{"gocloud.dev", "google.golang.org/api"}},
		// archive links only the file and memory drivers; cloud ones are the user's choice.
		{"./archive", []string{"gocloud.dev/blob/s3blob", "gocloud.dev/blob/gcsblob", "gocloud.dev/blob/azureblob", "github.com/aws/aws-sdk-go-v2", "cloud.google.com/go/storage", "github.com/Azure/azure-sdk-for-go"}},
		{".", []string{"modernc.org/sqlite", "github.com/jackc/pgx", "github.com/nats-io"}},
	}
	for _, c := range cases {
		out, err := exec.Command("go", "list", "-deps", c.pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", c.pkg, err, out)
		}
		deps := strings.Fields(string(out))
		for _, d := range deps {
			for _, f := range c.forbidden {
				if strings.HasPrefix(d, f) {
					t.Errorf("%s links %s (via %s): it must stay apart", c.pkg, f, d)
				}
			}
		}
		t.Logf("%s: %d packages", c.pkg, len(deps))
	}
}
