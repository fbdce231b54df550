package netns

import (
	"strings"
	"testing"
)

func TestValidName(t *testing.T) {
	for _, ok := range []string{"a", "pod-1", "x.y_z", "A9", "_x"[1:] + strings.Repeat("y", 62)} {
		if err := ValidName(ok); err != nil {
			t.Errorf("ValidName(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", ".", "..", "-a", "a/b", "a b", string(make([]byte, 64)), strings.Repeat("a", 64), "_a", "a\u00e9"} {
		if ValidName(bad) == nil {
			t.Errorf("ValidName(%q) accepted", bad)
		}
	}
}
