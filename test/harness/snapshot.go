package harness

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/hostlocal/store"
	"github.com/meshwire/meshwire/internal/netns"
)

// Snapshot is what a namespace shows of everything a meshwire command
// could leave behind: links, addresses, routes of every table, policy
// routing rules, the sysctls meshwire writes, qdiscs and tc filters,
// firewall rules of every backend present (iptables, legacy too, and nft);
// and for the host also named namespaces, bpffs pins with the entries of
// every pinned map, and files under /var/lib/cni, /run/meshwire and the
// given directories.
type Snapshot struct {
	Parts map[string][]string
}

var counters = regexp.MustCompile(`\[\d+:\d+\]`)

// StateDirs are the node directories every host snapshot walks: the CNI
// state (host-local stores, results caches, fast-path records) and
// meshwire's runtime files.
var StateDirs = []string{"/var/lib/cni", "/run/meshwire"}

// BPFFS is where the host snapshot looks for pins.
const BPFFS = "/sys/fs/bpf"

// TakeSnapshot reads the host's state. dirs are walked for files (IPAM
// stores, caches) that must not be left behind, beside StateDirs.
func TakeSnapshot(dirs ...string) (*Snapshot, error) {
	s, err := netState()
	if err != nil {
		return nil, err
	}
	names, err := netns.List()
	if err != nil {
		return nil, err
	}
	s.Parts["netns"] = names
	if err := s.addPins(BPFFS); err != nil {
		return nil, err
	}
	for _, d := range append(slices.Clone(StateDirs), dirs...) {
		if err := s.addFiles(d); err != nil {
			return nil, err
		}
	}
	s.sort()
	return s, nil
}

// nodeCaches are files meshwire writes once per node and never removes
// (the firewall backend detected for the host, firewall.CacheFile): the
// first command that detects writes it, whichever test that is.
func nodeCaches() []string {
	return append([]string{firewall.CacheFile}, firewall.OldCacheFiles...)
}

// addFiles lists the files under dir. Directories are not listed (a
// runtime or a plugin makes its state directory once per node), nor are a
// host-local store's database and lock, which stay on a node that ran
// pods: the addresses the store holds are listed instead, each with its
// owner, so a reservation left behind is a leak and an empty store is not.
func (s *Snapshot) addFiles(dir string) error {
	caches := nodeCaches()
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if slices.Contains(caches, p) {
			return nil
		}
		switch d.Name() {
		case store.LockName:
			return nil
		case store.DBName:
			held, err := store.ReadAll(p, 10*time.Second)
			if err != nil {
				return err
			}
			for _, a := range held {
				s.Parts["reservations"] = append(s.Parts["reservations"], fmt.Sprintf("%s %s %s/%s", filepath.Dir(p), a.IP, a.Owner.ID, a.Owner.IfName))
			}
			return nil
		}
		s.Parts["files"] = append(s.Parts["files"], p)
		return nil
	})
}

// SnapshotNS reads the same network state inside a pod's namespace: what
// judges a pod after its DEL (or a second iptables-init run) against a
// fresh pod's, with no grepping for names.
func SnapshotNS(n *NS) (*Snapshot, error) {
	var s *Snapshot
	err := n.Do(func() (err error) {
		s, err = netState()
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("snapshot of %s: %w", n.Name, err)
	}
	s.sort()
	return s, nil
}

func (s *Snapshot) sort() {
	for k := range s.Parts {
		sort.Strings(s.Parts[k])
	}
}

// netState reads the network state of the calling thread's namespace.
func netState() (*Snapshot, error) {
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
		rules, err := netlinksafe.RuleList(fam)
		if err != nil {
			return nil, err
		}
		for _, r := range rules {
			s.Parts["rules"] = append(s.Parts["rules"], ruleLine(fam, r))
		}
	}
	s.addSysctls(links)
	if err := s.addTC(links); err != nil {
		return nil, err
	}
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
		s.Parts["nft"] = nftLines(string(out))
	}
	return s, nil
}

// ruleLine describes a policy routing rule by what selects and where it
// sends (TPROXY's "fwmark 0x539 lookup 133", the kernel's own three).
func ruleLine(fam int, r netlink.Rule) string {
	f := "v4"
	if fam == netlink.FAMILY_V6 {
		f = "v6"
	}
	b := fmt.Sprintf("%s pref=%d table=%d", f, r.Priority, r.Table)
	if r.Mark != 0 || r.Mask != nil {
		b += fmt.Sprintf(" fwmark=%#x", r.Mark)
		if r.Mask != nil {
			b += fmt.Sprintf("/%#x", *r.Mask)
		}
	}
	if r.Src != nil {
		b += " from=" + r.Src.String()
	}
	if r.Dst != nil {
		b += " to=" + r.Dst.String()
	}
	if r.IifName != "" {
		b += " iif=" + r.IifName
	}
	if r.OifName != "" {
		b += " oif=" + r.OifName
	}
	if r.Invert {
		b += " not"
	}
	if r.Type != 0 && r.Type != unix.RTN_UNICAST {
		b += fmt.Sprintf(" type=%d", r.Type)
	}
	return b
}

// Sysctls meshwire writes: forwarding on the node, and per link the
// router-advertisement and localnet switches (see the plugins' pages).
var (
	globalSysctls  = []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding", "net/ipv4/conf/all/route_localnet"}
	perLinkSysctls = []string{"net/ipv4/conf/%s/route_localnet", "net/ipv6/conf/%s/accept_ra", "net/ipv6/conf/%s/accept_dad"}
)

// addSysctls reads them; a key missing (IPv6 off on a link) is skipped.
func (s *Snapshot) addSysctls(links []netlink.Link) {
	keys := slices.Clone(globalSysctls)
	for _, l := range links {
		for _, k := range perLinkSysctls {
			keys = append(keys, fmt.Sprintf(k, l.Attrs().Name))
		}
	}
	for _, k := range keys {
		if v, err := os.ReadFile(filepath.Join("/proc/sys", k)); err == nil {
			s.Parts["sysctls"] = append(s.Parts["sysctls"], k+"="+strings.TrimSpace(string(v)))
		}
	}
}

// addTC reads every link's qdiscs and the filters under each of them (the
// ingress and clsact hooks included).
func (s *Snapshot) addTC(links []netlink.Link) error {
	for _, l := range links {
		name := l.Attrs().Name
		qdiscs, err := netlinksafe.QdiscList(l)
		if err != nil {
			return fmt.Errorf("qdiscs of %s: %w", name, err)
		}
		parents := map[uint32]bool{}
		for _, q := range qdiscs {
			a := q.Attrs()
			s.Parts["qdiscs"] = append(s.Parts["qdiscs"], fmt.Sprintf("%s %s handle=%s parent=%s", name, q.Type(), netlink.HandleStr(a.Handle), netlink.HandleStr(a.Parent)))
			parents[a.Handle] = true
			if q.Type() == "ingress" || q.Type() == "clsact" {
				parents[netlink.HANDLE_MIN_INGRESS] = true
				parents[netlink.HANDLE_MIN_EGRESS] = true
			}
		}
		for parent := range parents {
			filters, err := netlinksafe.FilterList(l, parent)
			if err != nil {
				continue // a classless qdisc takes no filter
			}
			for _, f := range filters {
				a := f.Attrs()
				s.Parts["filters"] = append(s.Parts["filters"], fmt.Sprintf("%s parent=%s %s prio=%d proto=%#x", name, netlink.HandleStr(parent), f.Type(), a.Priority, a.Protocol))
			}
		}
	}
	return nil
}

// addPins lists the pins under dir and, for every pinned map, its keys:
// the fast path's and capture's per-pod entries.
func (s *Snapshot) addPins(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return nil
		}
		s.Parts["pins"] = append(s.Parts["pins"], p)
		if d.IsDir() {
			return nil
		}
		m, err := ebpf.LoadPinnedMap(p, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return nil // a program or a link
		}
		defer m.Close()
		// Keys only: a sockhash's values (sockets) cannot be read back.
		var key any // nil: the first key
		for {
			next := make([]byte, m.KeySize())
			if err := m.NextKey(key, &next); errors.Is(err, ebpf.ErrKeyNotExist) {
				break
			} else if err != nil {
				return fmt.Errorf("keys of %s: %w", p, err)
			}
			s.Parts["map entries"] = append(s.Parts["map entries"], fmt.Sprintf("%s %x", p, next))
			key = next
		}
		return nil
	})
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

// xtablesTable matches the header of a table iptables-nft creates.
var xtablesTable = regexp.MustCompile(`^table (ip|ip6|arp|bridge) (filter|nat|mangle|raw|security) \{$`)

// xtablesEmptyLine matches what an untouched iptables-nft table holds: its
// built-in chains with policy accept and no rule.
var xtablesEmptyLine = regexp.MustCompile(`^(chain (PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) \{|type \w+ hook \w+ priority [-\w]+; policy accept;|\})$`)

// nftLines are the non-empty lines of `nft -s list ruleset`, leaving out
// each iptables-nft table that holds nothing but its built-in chains with
// policy accept: what the nft variant of iptables leaves once a rule was
// written and removed (it never deletes a table), as saveLines leaves out
// legacy tables a read instantiated. A table of meshwire's own (named
// otherwise) is always kept, empty or not.
func nftLines(ruleset string) []string {
	var out, table []string
	empty := false
	for _, line := range strings.Split(ruleset, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		switch {
		case strings.HasPrefix(line, "table "):
			table, empty = []string{line}, xtablesTable.MatchString(line)
		case line == "}" && table != nil:
			if !empty {
				out = append(out, append(table, line)...)
			}
			table = nil
		case table != nil:
			table = append(table, line)
			empty = empty && xtablesEmptyLine.MatchString(strings.TrimSpace(line))
		default:
			out = append(out, line)
		}
	}
	return append(out, table...)
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

// StableSnapshot takes snapshots of the host until two in a row agree (or
// settle runs out), so that an earlier test's asynchronous teardown is not
// mistaken for what comes next.
func StableSnapshot(dirs ...string) (*Snapshot, error) {
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

// HostDiff compares the host with s, a snapshot of it taken with the same
// dirs, again until they agree or settle runs out (the kernel removes a
// deleted link's peer, routes and addresses asynchronously), and lists
// what still differs. The namespaces of live, which the test made after s
// and still uses (pods whose DEL was just judged), are no difference.
func (s *Snapshot) HostDiff(dirs []string, live ...*NS) ([]string, error) {
	return s.settledDiff(func() (*Snapshot, error) {
		now, err := TakeSnapshot(dirs...)
		if err != nil {
			return nil, err
		}
		now.Parts["netns"] = slices.DeleteFunc(now.Parts["netns"], func(name string) bool {
			return !slices.Contains(s.Parts["netns"], name) && slices.ContainsFunc(live, func(n *NS) bool { return n.Name == name })
		})
		return now, nil
	})
}

// NSDiff compares the namespace n with s, a SnapshotNS of it, as HostDiff
// does the host.
func (s *Snapshot) NSDiff(n *NS) ([]string, error) {
	return s.settledDiff(func() (*Snapshot, error) { return SnapshotNS(n) })
}

func (s *Snapshot) settledDiff(take func() (*Snapshot, error)) ([]string, error) {
	for deadline := time.Now().Add(settle); ; {
		now, err := take()
		if err != nil {
			return nil, err
		}
		if diff := s.Diff(now); len(diff) == 0 || time.Now().After(deadline) {
			return diff, nil
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// CheckNoLeaks takes a snapshot now and registers a cleanup (which runs after
// the cleanups registered later, i.e. after the test's own teardown) that
// fails the test if the host changed. Tests that touch the host call it first.
// Tests using it must not run in parallel with others that touch the host.
func (h *H) CheckNoLeaks(dirs ...string) {
	h.T.Helper()
	before, err := StableSnapshot(dirs...)
	if err != nil {
		h.T.Fatalf("snapshot host: %v", err)
	}
	h.T.Cleanup(func() {
		diff, err := before.HostDiff(dirs)
		if err != nil {
			h.T.Errorf("snapshot host: %v", err)
			return
		}
		if len(diff) > 0 {
			h.T.Errorf("host state changed by the test (leak or damage):\n  %s", strings.Join(diff, "\n  "))
		}
	})
}
