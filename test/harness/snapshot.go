package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/netns"
)

// Snapshot is what the host shows of the things a plugin could leak: links,
// addresses, routes, named namespaces, firewall rules of every backend present,
// and files under the given directories.
type Snapshot struct {
	Parts map[string][]string
}

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// TakeSnapshot reads the host's state. dirs are walked for files (IPAM stores,
// caches) that must not be left behind.
func TakeSnapshot(dirs ...string) (*Snapshot, error) {
	s := &Snapshot{Parts: map[string][]string{}}
	links, err := netlinksafe.LinkList()
	if err != nil {
		return nil, err
	}
	for _, l := range links {
		s.Parts["links"] = append(s.Parts["links"], fmt.Sprintf("%s type=%s", l.Attrs().Name, l.Type()))
	}
	addrs, err := netlinksafe.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		s.Parts["addrs"] = append(s.Parts["addrs"], a.IPNet.String())
	}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		routes, err := netlinksafe.RouteListFiltered(fam, &netlink.Route{Table: 0}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, err
		}
		for _, r := range routes {
			s.Parts["routes"] = append(s.Parts["routes"], fmt.Sprintf("table=%d %s", r.Table, r.String()))
		}
	}
	names, err := netns.List()
	if err != nil {
		return nil, err
	}
	s.Parts["netns"] = names
	for _, tool := range []string{"iptables-save", "ip6tables-save", "iptables-legacy-save", "ip6tables-legacy-save"} {
		if _, err := exec.LookPath(tool); err != nil {
			continue
		}
		out, err := exec.Command(tool).Output()
		if err != nil {
			return nil, fmt.Errorf("%s: %v", tool, err)
		}
		s.Parts[tool] = saveLines(string(out))
	}
	if _, err := exec.LookPath("nft"); err == nil {
		// -s (stateless): without the counters that any traffic changes.
		out, err := exec.Command("nft", "-s", "list", "ruleset").Output()
		if err != nil {
			return nil, fmt.Errorf("nft -s list ruleset: %v", err)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.TrimSpace(line) != "" {
				s.Parts["nft"] = append(s.Parts["nft"], line)
			}
		}
	}
	for _, d := range dirs {
		_ = filepath.Walk(d, func(p string, info os.FileInfo, err error) error {
			if err == nil {
				s.Parts["files"] = append(s.Parts["files"], p)
			}
			return nil
		})
	}
	for k := range s.Parts {
		sort.Strings(s.Parts[k])
	}
	return s, nil
}

// saveLines are the lines of iptables-save output that say something,
// counters removed, leaving out each table that holds nothing but its
// built-in chains with policy ACCEPT: what merely reading a table leaves
// behind (legacy iptables instantiates a table when a tool reads it, and
// nothing unloads it), on a host where any tool may read any table.
func saveLines(save string) []string {
	var out, table []string
	empty := true
	for _, line := range strings.Split(save, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		line = counters.ReplaceAllString(line, "")
		table = append(table, line)
		switch {
		case strings.HasPrefix(line, "*"):
			table, empty = []string{line}, true
		case strings.HasPrefix(line, ":"):
			if f := strings.Fields(line); len(f) < 2 || f[1] != "ACCEPT" {
				empty = false // a user chain ("-"), or a policy set
			}
		case line == "COMMIT":
			if !empty {
				out = append(out, table...)
			}
			table = nil
		default:
			empty = false
		}
	}
	return out
}

// Diff lists what is in after but not in s, and what disappeared, per part.
func (s *Snapshot) Diff(after *Snapshot) []string {
	var out []string
	for part, lines := range after.Parts {
		for _, l := range minus(lines, s.Parts[part]) {
			out = append(out, fmt.Sprintf("%s: added %q", part, l))
		}
	}
	for part, lines := range s.Parts {
		for _, l := range minus(lines, after.Parts[part]) {
			out = append(out, fmt.Sprintf("%s: removed %q", part, l))
		}
	}
	sort.Strings(out)
	return out
}

func minus(a, b []string) []string {
	seen := map[string]int{}
	for _, x := range b {
		seen[x]++
	}
	var out []string
	for _, x := range a {
		if seen[x] > 0 {
			seen[x]--
			continue
		}
		out = append(out, x)
	}
	return out
}

// settle bounds how long the leak check waits for the kernel to finish
// tearing down what a test removed: a deleted namespace takes its veth peers
// and their routes with it asynchronously.
const settle = 3 * time.Second

// stableSnapshot takes snapshots until two in a row agree (or settle runs
// out), so that the previous test's asynchronous teardown is not mistaken for
// this test's doing.
func stableSnapshot(dirs []string) (*Snapshot, error) {
	prev, err := TakeSnapshot(dirs...)
	if err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(settle); time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		cur, err := TakeSnapshot(dirs...)
		if err != nil {
			return nil, err
		}
		if len(prev.Diff(cur)) == 0 {
			return cur, nil
		}
		prev = cur
	}
	return prev, nil
}

// CheckNoLeaks takes a snapshot now and registers a cleanup (which runs after
// the cleanups registered later, i.e. after the test's own teardown) that
// fails the test if the host changed. Tests that touch the host call it first.
// Tests using it must not run in parallel with others that touch the host.
func (h *H) CheckNoLeaks(dirs ...string) {
	h.T.Helper()
	before, err := stableSnapshot(dirs)
	if err != nil {
		h.T.Fatalf("snapshot host: %v", err)
	}
	h.T.Cleanup(func() {
		var diff []string
		for deadline := time.Now().Add(settle); ; {
			after, err := TakeSnapshot(dirs...)
			if err != nil {
				h.T.Errorf("snapshot host: %v", err)
				return
			}
			if diff = before.Diff(after); len(diff) == 0 || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if len(diff) > 0 {
			h.T.Errorf("host state changed by the test (leak or damage):\n  %s", strings.Join(diff, "\n  "))
		}
	})
}
