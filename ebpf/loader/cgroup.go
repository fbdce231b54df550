package loader

import (
	"bufio"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// CgroupDir is the cgroup v2 directory to attach at: dir (or dir/unified,
// for a host's /sys/fs/cgroup mounted into a container on a hybrid
// layout), or the cgroup2 mount when dir is empty.
func CgroupDir(dir string) (string, error) {
	if dir == "" {
		return Cgroup2Root()
	}
	for _, d := range []string{dir, filepath.Join(dir, "unified")} {
		var st unix.Statfs_t
		if unix.Statfs(d, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return d, nil
		}
	}
	return "", Unsupported("%s is not a cgroup v2 directory (nor is %s/unified)", dir, dir)
}

// Cgroup2Root is the cgroup v2 mount point, read from /proc/self/mountinfo
// (on hybrid layouts it is not /sys/fs/cgroup).
func Cgroup2Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", Unsupported("read /proc/self/mountinfo: %v", err)
	}
	defer f.Close()
	if p, ok := cgroup2FromMountinfo(f); ok {
		return p, nil
	}
	return "", Unsupported("no cgroup v2 mount in /proc/self/mountinfo: sockops programs attach to a cgroup v2")
}

// cgroup2FromMountinfo returns the mount point of the first cgroup2 mount.
// A mountinfo line is: id parent major:minor root mountpoint options
// [optional fields...] - fstype source superoptions.
func cgroup2FromMountinfo(r io.Reader) (string, bool) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 1 || g[0] != "cgroup2" {
			continue
		}
		return unescapeMount(f[4]), true
	}
	return "", false
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }
