package metricname

import (
	"regexp"
	"strings"
	"testing"
)

func TestPrefixesAreNamespaceSubsystem(t *testing.T) {
	re := regexp.MustCompile(`^[a-z]+_[a-z]+_$`)
	seen := map[string]bool{}
	for _, p := range Prefixes() {
		if !strings.HasPrefix(p, Namespace+"_") || !re.MatchString(p) {
			t.Errorf("prefix %q is not %s_<subsystem>_", p, Namespace)
		}
		if seen[p] {
			t.Errorf("prefix %q listed twice", p)
		}
		seen[p] = true
	}
}
