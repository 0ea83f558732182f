package producebench

import "testing"

func TestParseStat(t *testing.T) {
	for _, tc := range []struct {
		line  string
		comm  string
		ticks int64
		ok    bool
	}{
		{"1234 (postgres) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 1 0 100 0 0", "postgres", 325, true},
		{"1234 (postgres) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 1 0 100 0 0", "nats-server", 0, false},
		// a name with spaces and parentheses: fields count from the last ")"
		{"77 (odd) name)) R 1 77 77 0 -1 0 0 0 0 0 9 1 0 0 20 0 1 0 5 0 0", "odd) name)", 10, true},
		{"77 (postgres) R 1 2", "postgres", 0, false},                        // truncated
		{"77 (postgres) R 1 77 77 0 -1 0 0 0 0 0 x 1", "postgres", 0, false}, // not a number
		{"garbage", "postgres", 0, false},
	} {
		got, ok := parseStat([]byte(tc.line), tc.comm)
		if ok != tc.ok || got != tc.ticks {
			t.Errorf("parseStat(%q, %q) = %d, %v; want %d, %v", tc.line, tc.comm, got, ok, tc.ticks, tc.ok)
		}
	}
}

func TestReadCPUClientAdvances(t *testing.T) {
	c0 := ReadCPU()
	if c0.Client < 0 {
		t.Skip("no process CPU clock on this platform")
	}
	x := 0
	for i := range 50_000_000 {
		x += i % 7
	}
	c1 := ReadCPU()
	if c1.Client <= c0.Client {
		t.Fatalf("client CPU did not advance after a busy loop (%v → %v, x=%d)", c0.Client, c1.Client, x)
	}
}
