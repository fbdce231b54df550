package podveth

import (
	"errors"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/cnierr"
)

func TestJoinErrors(t *testing.T) {
	if joinErrors(nil, nil) != nil {
		t.Fatal("no failure must be nil")
	}
	one := cnierr.TryAgain("xtables lock busy")
	if got := joinErrors(nil, one, nil); got != one {
		t.Fatalf("one failure must come back as it is, got %v", got)
	}
	got := joinErrors(cnierr.TryAgain("lock"), errors.New("plain"))
	if cnierr.Code(got) != cnierr.CodeTryAgainLater || !strings.Contains(got.Error(), "lock") || !strings.Contains(got.Error(), "plain") {
		t.Fatalf("joined: code %d %q", cnierr.Code(got), got)
	}
}
