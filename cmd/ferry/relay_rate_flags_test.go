package main

import (
	"context"
	"io"
	"strings"
	"testing"
)

// TestRelayRateFlags: --publish-rate/--publish-burst/--tenant-share reach
// the relay options, and a bad value is refused naming the flag and the
// limit before anything connects.
func TestRelayRateFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // "" = accepted
	}{
		{[]string{"--publish-rate", "500"}, ""},
		{[]string{"--publish-rate", "500", "--publish-burst", "100"}, ""},
		{[]string{"--tenant-share", "50"}, ""},
		{[]string{"--publish-rate", "-1"}, "--publish-rate must be in 0..1e+07"},
		{[]string{"--publish-burst", "10"}, "--publish-burst needs a publish rate > 0"},
		{[]string{"--publish-rate", "5", "--publish-burst", "20000"}, "--publish-burst must be in 1..10000"},
		{[]string{"--tenant-share", "-3"}, "--tenant-share must be in 0..10000"},
	} {
		// No --database-url: an accepted setting fails later, at the store.
		cmd := newRelayCmd()
		cmd.SetArgs(c.args)
		cmd.SetOut(io.Discard)
		cmd.SetErr(io.Discard)
		err := cmd.ExecuteContext(context.Background())
		if err == nil {
			t.Fatalf("%v: ran without a database", c.args)
		}
		named := strings.Contains(err.Error(), "--publish-") || strings.Contains(err.Error(), "--tenant-share")
		switch {
		case c.want == "" && named:
			t.Errorf("%v: refused: %v", c.args, err)
		case c.want != "" && !strings.Contains(err.Error(), c.want):
			t.Errorf("%v: error %v, want it to contain %q", c.args, err, c.want)
		}
	}
}
