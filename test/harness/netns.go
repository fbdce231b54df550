package harness

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/internal/netns"
)

// NS is a throwaway named network namespace.
type NS struct {
	Name string
	Path string
	h    *H
	open *netns.NS // opened by Netlink
}

// NewNS creates a namespace as kerneltest.NewNS names it (mwt-<prefix>-...)
// and removes it at cleanup. The name is visible to `ip netns` while the
// test runs.
func (h *H) NewNS(prefix string) *NS {
	h.T.Helper()
	name, p := kerneltest.NewNS(h.T, prefix)
	n := &NS{Name: name, Path: p, h: h}
	// Registered after the namespace's removal, so run before it.
	h.T.Cleanup(func() {
		if n.open != nil {
			n.open.Close()
		}
	})
	return n
}

// Netlink returns a netlink handle that operates inside the namespace, the
// plugins' own kind (netns.Open: dumps retried when interrupted).
func (n *NS) Netlink() *netns.Netlink {
	n.h.T.Helper()
	if n.open == nil {
		o, err := netns.Open(n.Path)
		if err != nil {
			n.h.T.Fatalf("netlink handle in %s: %v", n.Name, err)
		}
		n.open = o
	}
	return &n.open.NL
}

// Do runs fn with the calling goroutine's thread inside the namespace.
func (n *NS) Do(fn func() error) error {
	return ns.WithNetNSPath(n.Path, func(ns.NetNS) error { return fn() })
}

// Link returns the named link, failing the test if absent.
func (n *NS) Link(name string) netlink.Link {
	n.h.T.Helper()
	l, err := n.Netlink().LinkByName(name)
	if err != nil {
		n.h.T.Fatalf("link %s in %s: %v", name, n.Name, err)
	}
	return l
}

// HasLink reports whether the namespace has a link of that name.
func (n *NS) HasLink(name string) bool {
	_, err := n.Netlink().LinkByName(name)
	return err == nil
}

// IsUp reports whether the link is administratively up.
func (n *NS) IsUp(name string) bool {
	return n.Link(name).Attrs().Flags&net.FlagUp != 0
}

// Addrs returns the addresses of a link as CIDR strings ("127.0.0.1/8").
func (n *NS) Addrs(link string) []string {
	n.h.T.Helper()
	addrs, err := n.Netlink().AddrList(n.Link(link), netlink.FAMILY_ALL)
	if err != nil {
		n.h.T.Fatalf("addresses of %s in %s: %v", link, n.Name, err)
	}
	var out []string
	for _, a := range addrs {
		out = append(out, a.IPNet.String())
	}
	return out
}

// Routes returns the main-table routes of the given family.
func (n *NS) Routes(family int) []netlink.Route {
	n.h.T.Helper()
	rs, err := n.Netlink().RouteList(nil, family)
	if err != nil {
		n.h.T.Fatalf("routes in %s: %v", n.Name, err)
	}
	return rs
}

// Qdiscs returns the qdiscs of a link.
func (n *NS) Qdiscs(link string) []netlink.Qdisc {
	n.h.T.Helper()
	qs, err := n.Netlink().QdiscList(n.Link(link))
	if err != nil {
		n.h.T.Fatalf("qdiscs of %s in %s: %v", link, n.Name, err)
	}
	return qs
}

// Sysctl reads a sysctl inside the namespace, as "net.ipv4.ip_forward" or,
// when a name holds dots, "net/ipv4/conf/eth0.100/forwarding".
func (n *NS) Sysctl(key string) string {
	n.h.T.Helper()
	var v []byte
	err := n.Do(func() error {
		var err error
		if !strings.Contains(key, "/") {
			key = strings.ReplaceAll(key, ".", "/")
		}
		v, err = os.ReadFile(filepath.Join("/proc/sys", key))
		return err
	})
	if err != nil {
		n.h.T.Fatalf("sysctl %s in %s: %v", key, n.Name, err)
	}
	return strings.TrimSpace(string(v))
}

// Exec runs a command inside the namespace (through `ip netns exec`) and
// returns its combined output.
func (n *NS) Exec(name string, args ...string) (string, error) {
	return Run("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
}

// ExecStdin is Exec with stdin (a restore payload, an nft script).
func (n *NS) ExecStdin(stdin, name string, args ...string) (string, error) {
	return n.exec(stdin, nil, name, args...)
}

// ExecEnv is Exec with variables ("NAME=value") added to the environment.
func (n *NS) ExecEnv(env []string, name string, args ...string) (string, error) {
	return n.exec("", env, name, args...)
}

func (n *NS) exec(stdin string, env []string, name string, args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", n.Name, name}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// IPTablesSave returns the rules (counters stripped, comments dropped) of
// one iptables tool run inside the namespace, e.g. "iptables-save",
// "ip6tables-legacy-save"; table "" means all tables.
func (n *NS) IPTablesSave(tool, table string) string {
	n.h.T.Helper()
	args := []string{}
	if table != "" {
		args = append(args, "-t", table)
	}
	out, err := n.Exec(tool, args...)
	if err != nil {
		n.h.T.Fatalf("%s in %s: %v: %s", tool, n.Name, err, out)
	}
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, counters.ReplaceAllString(l, ""))
		}
	}
	return strings.Join(lines, "\n")
}

// NewOutside makes a namespace standing for a host elsewhere on the network,
// linked to the host by a veth pair: the host end hostName (removed at
// cleanup) gets hostAddrs, the far end eth0 gets farAddrs, all without
// duplicate address detection; both ends and the far lo are up.
func (h *H) NewOutside(prefix, hostName string, hostAddrs, farAddrs []string) *NS {
	h.T.Helper()
	ns := h.NewNS(prefix)
	nsFd, err := os.Open(ns.Path)
	if err != nil {
		h.T.Fatal(err)
	}
	defer nsFd.Close()
	la := netlink.NewLinkAttrs()
	la.Name = hostName
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "eth0", PeerNamespace: netlink.NsFd(nsFd.Fd())}); err != nil {
		h.T.Fatalf("create %s: %v", hostName, err)
	}
	h.T.Cleanup(func() {
		if l, err := netlink.LinkByName(hostName); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	host, err := netlink.LinkByName(hostName)
	if err != nil {
		h.T.Fatal(err)
	}
	h.addAddrs(netlink.AddrAdd, host, hostAddrs)
	if err := netlink.LinkSetUp(host); err != nil {
		h.T.Fatal(err)
	}
	nl := ns.Netlink()
	far := ns.Link("eth0")
	h.addAddrs(nl.AddrAdd, far, farAddrs)
	for _, l := range []netlink.Link{far, ns.Link("lo")} {
		if err := nl.LinkSetUp(l); err != nil {
			h.T.Fatal(err)
		}
	}
	return ns
}

func (h *H) addAddrs(add func(netlink.Link, *netlink.Addr) error, l netlink.Link, cidrs []string) {
	h.T.Helper()
	for _, c := range cidrs {
		a, err := netlink.ParseAddr(c)
		if err != nil {
			h.T.Fatal(err)
		}
		a.Flags = unix.IFA_F_NODAD
		if err := add(l, a); err != nil {
			h.T.Fatalf("address %s on %s: %v", c, l.Attrs().Name, err)
		}
	}
}
