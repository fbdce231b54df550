package netns

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestNsfsMounts(t *testing.T) {
	p := filepath.Join(t.TempDir(), "mountinfo")
	info := `22 1 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
531 29 0:4 net:[4026532281] /run/netns/cni-1234 rw shared:290 - nsfs nsfs rw
532 29 0:4 net:[4026532282] /var/run/netns/x rw - nsfs nsfs rw
533 29 0:4 mnt:[4026532290] /run/ns/mnt rw - nsfs nsfs rw
40 29 0:44 / /run/netns rw,nosuid,nodev shared:20 - tmpfs tmpfs rw
`
	if err := os.WriteFile(p, []byte(info), 0o600); err != nil {
		t.Fatal(err)
	}
	var got []string
	nsfsMounts(p, func(s string) { got = append(got, s) })
	want := []string{"net:[4026532281]", "net:[4026532282]", "mnt:[4026532290]"}
	if !slices.Equal(got, want) {
		t.Fatalf("nsfsMounts = %q, want %q", got, want)
	}
}
