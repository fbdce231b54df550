package loader

import (
	"strings"
	"testing"
)

func TestCgroup2FromMountinfo(t *testing.T) {
	for _, tc := range []struct {
		name, mountinfo, want string
		ok                    bool
	}{
		{"hybrid layout", `25 30 0:22 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:7 - cgroup2 cgroup2 rw,nsdelegate
27 25 0:24 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,name=systemd`, "/sys/fs/cgroup/unified", true},
		{"unified layout, optional fields", `35 24 0:30 / /sys/fs/cgroup rw,nosuid shared:9 master:1 - cgroup2 cgroup2 rw`, "/sys/fs/cgroup", true},
		{"escaped space", `35 24 0:30 / /mnt/cg\040two rw - cgroup2 none rw`, "/mnt/cg two", true},
		{"cgroup v1 only", `27 25 0:24 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu`, "", false},
		{"malformed lines", "garbage\n1 2 3 - cgroup2\n - \n", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := cgroup2FromMountinfo(strings.NewReader(tc.mountinfo))
			if got != tc.want || ok != tc.ok {
				t.Fatalf("got %q, %v; want %q, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// FuzzCgroup2FromMountinfo: any text gives a mount point that is one of its
// mountinfo fields (unescaped), never a panic.
func FuzzCgroup2FromMountinfo(f *testing.F) {
	f.Add("26 25 0:23 / /sys/fs/cgroup/unified rw shared:7 - cgroup2 cgroup2 rw\n")
	f.Add(`35 24 0:30 / /mnt/cg\040two rw - cgroup2 none rw`)
	f.Add(`1 2 3 4 \1\12\123\ - cgroup2`)
	f.Add(" - cgroup2\n - \n")
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := cgroup2FromMountinfo(strings.NewReader(s))
		if !ok {
			if got != "" {
				t.Fatalf("not found but returned %q", got)
			}
			return
		}
		for _, line := range strings.Split(s, "\n") {
			pre, _, found := strings.Cut(line, " - ")
			if f := strings.Fields(pre); found && len(f) >= 5 && unescapeMount(f[4]) == got {
				return
			}
		}
		t.Fatalf("%q is no mount point of the input", got)
	})
}
