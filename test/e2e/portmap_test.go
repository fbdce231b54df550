//go:build kernel

package e2e

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/probe"
	"github.com/meshwire/meshwire/test/harness"
)

// Addresses and names of the portmap tests: pods in 198.18.48.0/24 and
// fd50:48::/64 behind a bridge mwtp<random>; the outside client in its own
// namespace behind a veth pair, host end 198.18.50.1/30 and fd50:50::1/64,
// client end .2 and ::2. Host ports 30000-30999.
const (
	pmHost4   = "198.18.50.1"
	pmHost6   = "fd50:50::1"
	pmClient4 = "198.18.50.2"
	pmClient6 = "fd50:50::2"
	pmGw4     = "198.18.48.1"
	pmGw6     = "fd50:48::1"
)

// portmapEnv is one test's bridge, IPAM store and outside client.
type portmapEnv struct {
	h       *harness.H
	br      string
	dataDir string
	outside *harness.NS
}

// newPortmapEnv checks the host for leaks and builds the outside client.
// The bridge (which outlives its pods, as the reference's cni0 does) is
// removed after the test, before the leak check.
func newPortmapEnv(t *testing.T) *portmapEnv {
	t.Helper()
	h := harness.New(t)
	nodeBaseline(t)
	e := &portmapEnv{h: h, br: "mwtp" + harness.RandomID()[:6], dataDir: t.TempDir()}
	h.CheckNoLeaks()
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(e.br); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	e.outside = portmapOutside(t, h)
	return e
}

// portmapOutside makes the outside client namespace. It has no route to the
// pods: it only reaches the host's own addresses, as a client elsewhere on
// the network would.
func portmapOutside(t *testing.T, h *harness.H) *harness.NS {
	t.Helper()
	return h.NewOutside("pmout", "mwtpo"+harness.RandomID()[:6],
		[]string{pmHost4 + "/30", pmHost6 + "/64"}, []string{pmClient4 + "/30", pmClient6 + "/64"})
}

// list is a conflist of meshwire's bridge (dual stack, hairpin) and
// portmap with extra portmap keys.
func (e *portmapEnv) list(cniVersion, name string, portmapKeys map[string]any) *libcni.NetworkConfigList {
	bridge := map[string]any{
		"type": "bridge", "bridge": e.br, "isGateway": true, "hairpinMode": true, "hostVethPrefix": "mwtp",
		"ipam": map[string]any{
			"type": "host-local", "dataDir": e.dataDir,
			"ranges": [][]map[string]string{{{"subnet": "198.18.48.0/24"}}, {{"subnet": "fd50:48::/64"}}},
			"routes": []map[string]string{{"dst": "0.0.0.0/0"}, {"dst": "::/0"}},
		},
	}
	pm := map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}}
	for k, v := range portmapKeys {
		pm[k] = v
	}
	b, _ := json.Marshal(map[string]any{"cniVersion": cniVersion, "name": name, "plugins": []any{bridge, pm}})
	return e.h.ConfList(string(b))
}

type pmPort struct {
	host, container int
	proto, hostIP   string
}

func portmapCaps(ports ...pmPort) map[string]any {
	var pms []map[string]any
	for _, p := range ports {
		m := map[string]any{"hostPort": p.host, "containerPort": p.container, "protocol": p.proto}
		if p.hostIP != "" {
			m["hostIP"] = p.hostIP
		}
		pms = append(pms, m)
	}
	return map[string]any{"portMappings": pms}
}

// pod is a namespace attached through the conflist, running a TCP server
// on port 80 and a UDP server on port 81 that answer with the source
// address they see.
type pmPod struct {
	ns     *harness.NS
	att    *harness.Attachment
	v4, v6 net.IP
}

func (e *portmapEnv) pod(t *testing.T, list *libcni.NetworkConfigList, ports ...pmPort) *pmPod {
	t.Helper()
	p := e.unstartedPod(list, ports...)
	r := p.att.MustAdd()
	p.addrs(t, r)
	portmapServe(t, p.ns)
	e.waitBridgeReady(t)
	return p
}

// waitBridgeReady waits until the bridge's IPv6 link-local address has
// passed duplicate address detection: until then the kernel sends no
// neighbour solicitation for forwarded packets, so outside IPv6 clients
// cannot reach a pod behind a bridge created a moment ago (a node's bridge
// is long-lived; the tests' are fresh).
func (e *portmapEnv) waitBridgeReady(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l, err := netlink.LinkByName(e.br)
		if err != nil {
			t.Fatalf("bridge %s: %v", e.br, err)
		}
		addrs, err := netlinksafe.AddrList(l, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() && a.Flags&(unix.IFA_F_TENTATIVE|unix.IFA_F_DADFAILED) == 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("bridge %s has no usable IPv6 link-local address: %v", e.br, addrs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (e *portmapEnv) unstartedPod(list *libcni.NetworkConfigList, ports ...pmPort) *pmPod {
	ns := e.h.NewNS("pm")
	return &pmPod{ns: ns, att: e.h.Attach(list, ns, "eth0", portmapCaps(ports...))}
}

func (p *pmPod) addrs(t *testing.T, r *current.Result) {
	t.Helper()
	if err := p.setAddrs(r); err != nil {
		t.Fatal(err)
	}
}

func (p *pmPod) setAddrs(r *current.Result) error {
	for _, ip := range r.IPs {
		if ip.Address.IP.To4() != nil {
			p.v4 = ip.Address.IP
		} else {
			p.v6 = ip.Address.IP
		}
	}
	if p.v4 == nil || p.v6 == nil {
		return fmt.Errorf("pod lacks an address: %+v", r)
	}
	return nil
}

// portmapServe starts the pod's servers (one socket per family: a
// dual-stack wildcard socket depends on Go's one-time IPv6 probe, which a
// namespace with lo down fails); they stop with the test.
func portmapServe(t *testing.T, ns *harness.NS) {
	t.Helper()
	for _, fam := range []struct{ tcp, udp, any string }{{"tcp4", "udp4", "0.0.0.0"}, {"tcp6", "udp6", "::"}} {
		ln, err := probe.Listen(ns.Path, fam.tcp, net.JoinHostPort(fam.any, "80"))
		if err != nil {
			t.Fatalf("listen %s in %s: %v", fam.tcp, ns.Name, err)
		}
		pc, err := probe.InNS(ns.Path, func() (net.PacketConn, error) { return net.ListenPacket(fam.udp, net.JoinHostPort(fam.any, "81")) })
		if err != nil {
			t.Fatalf("listen %s in %s: %v", fam.udp, ns.Name, err)
		}
		t.Cleanup(func() { ln.Close(); pc.Close() })
		go portmapServeTCP(ln)
		go portmapServeUDP(pc)
	}
}

func portmapServeTCP(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
		fmt.Fprintf(c, "%s\n", host)
		c.Close()
	}
}

func portmapServeUDP(pc net.PacketConn) {
	buf := make([]byte, 64)
	for {
		_, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		host, _, _ := net.SplitHostPort(from.String())
		_, _ = pc.WriteTo([]byte(host+"\n"), from)
	}
}

// portmapTCP connects from the namespace (nil: the host) and returns the
// source address the pod saw.
func portmapTCP(ns *harness.NS, ip string, port int) (string, error) {
	addr := net.JoinHostPort(ip, fmt.Sprint(port))
	var c net.Conn
	var err error
	if ns == nil {
		c, err = net.DialTimeout("tcp", addr, 2*time.Second)
	} else {
		c, err = probe.Dial(ns.Path, "tcp", addr, 2*time.Second)
	}
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && err != io.EOF {
		return "", fmt.Errorf("read from %s: %w", addr, err)
	}
	return strings.TrimSpace(line), nil
}

// portmapUDP sends datagrams (a few, UDP may drop the first while
// neighbours resolve) and returns the source address the pod saw.
func portmapUDP(ns *harness.NS, ip string, port int) (string, error) {
	addr := net.JoinHostPort(ip, fmt.Sprint(port))
	dial := func() (net.Conn, error) { return net.Dial("udp", addr) }
	var c net.Conn
	var err error
	if ns == nil {
		c, err = dial()
	} else {
		c, err = probe.InNS(ns.Path, dial)
	}
	if err != nil {
		return "", err
	}
	defer c.Close()
	buf := make([]byte, 64)
	for i := 0; i < 5; i++ {
		if _, err := c.Write([]byte("hello\n")); err != nil {
			return "", err
		}
		_ = c.SetReadDeadline(time.Now().Add(400 * time.Millisecond))
		n, err := c.Read(buf)
		if err == nil {
			return strings.TrimSpace(string(buf[:n])), nil
		}
	}
	return "", fmt.Errorf("no UDP answer from %s", addr)
}

func portmapMustReach(t *testing.T, what string, got string, err error, wantSrc string) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if wantSrc != "" && got != wantSrc {
		t.Fatalf("%s: the pod saw source %s, want %s", what, got, wantSrc)
	}
}

func portmapMustNotReach(t *testing.T, what string, got string, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: reached the pod (it saw %s), want no connection", what, got)
	}
}

// portmapRules is every meshwire portmap rule on the host, of all backends.
func portmapRules(t *testing.T) string {
	t.Helper()
	var b strings.Builder
	for _, tool := range []string{"iptables-save", "ip6tables-save", "iptables-legacy-save", "ip6tables-legacy-save"} {
		out, err := exec.Command(tool, "-t", "nat").CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v: %s", tool, err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "MWHP") || strings.Contains(l, "MESHWIRE-HOSTPORTS") {
				fmt.Fprintf(&b, "%s: %s\n", tool, l)
			}
		}
	}
	if out, err := exec.Command("nft", "list", "table", "inet", "meshwire_portmap").CombinedOutput(); err == nil {
		b.Write(out)
	}
	return b.String()
}

// portmapAssertClean fails the test if rules of the given attachments
// remain, or, when no attachment of anyone is left, if the base chains
// remain. (Other users of the machine, such as another test process or a
// demo, may have attachments: then the base legitimately stays.)
func portmapAssertClean(t *testing.T, when string, atts ...*harness.Attachment) {
	t.Helper()
	rules := portmapRules(t)
	for _, a := range atts {
		for _, k := range []string{portmapKey(a), portmapOlderKey(a)} {
			if strings.Contains(rules, k) {
				t.Fatalf("%s: rules of attachment %s remain:\n%s", when, k, rules)
			}
		}
	}
	if rules != "" && !pmAttachmentRE.MatchString(rules) {
		t.Fatalf("%s: base rules remain with no attachment left:\n%s", when, rules)
	}
}

var pmAttachmentRE = regexp.MustCompile(`(MWHP|pm)-[0-9a-f]{16}`)

// portmapKey is the attachment key the plugin puts in chain names: 16 hex
// digits of sha256(container id "/" ifname).
func portmapKey(a *harness.Attachment) string {
	sum := sha256.Sum256([]byte(a.RT.ContainerID + "/" + a.RT.IfName))
	return hex.EncodeToString(sum[:8])
}

// portmapOlderKey is the key an older meshwire put in chain names: 16 hex
// digits of sha256(container id NUL ifname).
func portmapOlderKey(a *harness.Attachment) string {
	sum := sha256.Sum256([]byte(a.RT.ContainerID + "\x00" + a.RT.IfName))
	return hex.EncodeToString(sum[:8])
}

var pmBackends = []string{"iptables", "nftables", "iptables-legacy", "auto"}

func pmKeys(backend string) map[string]any {
	if backend == "auto" {
		return nil
	}
	return map[string]any{"backend": backend}
}

// TestPortmapTraffic maps TCP and UDP host ports of a dual-stack pod and
// sends real traffic from an outside namespace, from the host (its own
// address and 127.0.0.1) and from the pod itself (hairpin), with every
// backend; then DEL must leave nothing and the ports must be closed.
func TestPortmapTraffic(t *testing.T) {
	for i, backend := range pmBackends {
		t.Run(backend, func(t *testing.T) {
			e := newPortmapEnv(t)
			list := e.list("1.1.0", "mwtp-traffic", pmKeys(backend))
			base := 30000 + 10*i
			p := e.pod(t, list,
				pmPort{base, 80, "tcp", ""},
				pmPort{base + 1, 81, "udp", ""},
				pmPort{base + 2, 80, "tcp", pmHost4},
				pmPort{base + 3, 80, "TCP", pmHost6})
			got, err := portmapTCP(e.outside, pmHost4, base)
			portmapMustReach(t, "outside -> host:tcp", got, err, pmClient4)
			got, err = portmapTCP(e.outside, pmHost6, base)
			portmapMustReach(t, "outside -> [host]:tcp", got, err, pmClient6)
			got, err = portmapUDP(e.outside, pmHost4, base+1)
			portmapMustReach(t, "outside -> host:udp", got, err, pmClient4)
			got, err = portmapUDP(e.outside, pmHost6, base+1)
			portmapMustReach(t, "outside -> [host]:udp", got, err, pmClient6)
			got, err = portmapTCP(nil, pmHost4, base)
			portmapMustReach(t, "host -> own address", got, err, "")
			got, err = portmapTCP(nil, "127.0.0.1", base)
			portmapMustReach(t, "host -> 127.0.0.1", got, err, pmGw4)
			if v := e.hostSysctl(t, "net/ipv4/conf/"+e.br+"/route_localnet"); v != "1" {
				t.Fatalf("route_localnet on %s is %s", e.br, v)
			}
			got, err = portmapTCP(p.ns, pmHost4, base)
			portmapMustReach(t, "hairpin (pod -> its own host port)", got, err, pmGw4)
			got, err = portmapTCP(p.ns, pmHost6, base)
			portmapMustReach(t, "hairpin IPv6", got, err, pmGw6)
			// hostIP binds: the port answers on that address only.
			got, err = portmapTCP(e.outside, pmHost4, base+2)
			portmapMustReach(t, "outside -> hostIP-bound port", got, err, pmClient4)
			got, err = portmapTCP(nil, pmGw4, base+2)
			portmapMustNotReach(t, "host -> hostIP-bound port on another address", got, err)
			got, err = portmapTCP(e.outside, pmHost6, base+3)
			portmapMustReach(t, "outside -> IPv6 hostIP-bound port", got, err, pmClient6)
			got, err = portmapTCP(e.outside, pmHost4, base+3)
			portmapMustNotReach(t, "IPv6-bound port over IPv4", got, err)

			if err := p.att.Check(); err != nil {
				t.Fatalf("CHECK: %v", err)
			}
			if err := e.h.Status(list); err != nil {
				t.Fatalf("STATUS: %v", err)
			}
			if !strings.Contains(portmapRules(t), portmapKey(p.att)) {
				t.Fatalf("no rules tagged with the attachment key %s:\n%s", portmapKey(p.att), portmapRules(t))
			}
			if err := p.att.Del(); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			portmapAssertClean(t, "after the last DEL", p.att)
			if _, err := os.Stat("/run/meshwire/portmap/backend"); err == nil {
				t.Fatal("the remembered backend outlived the last mapping")
			}
			got, err = portmapTCP(e.outside, pmHost4, base)
			portmapMustNotReach(t, "outside -> host port after DEL", got, err)
			if err := p.att.Del(); err != nil {
				t.Fatalf("second DEL: %v", err)
			}
		})
	}
}

func (e *portmapEnv) hostSysctl(t *testing.T, key string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/" + key)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestPortmapSNAT: with snat off nothing is masqueraded (127.0.0.1 and
// hairpin cannot work, as with the reference); with masqAll even outside
// clients are, so the pod sees the bridge address.
func TestPortmapSNAT(t *testing.T) {
	for _, backend := range []string{"iptables", "nftables"} {
		t.Run("off-"+backend, func(t *testing.T) {
			e := newPortmapEnv(t)
			keys := pmKeys(backend)
			keys["snat"] = false
			p := e.pod(t, e.list("1.1.0", "mwtp-snat-off", keys), pmPort{30100, 80, "tcp", ""})
			got, err := portmapTCP(e.outside, pmHost4, 30100)
			portmapMustReach(t, "outside", got, err, pmClient4)
			got, err = portmapTCP(nil, "127.0.0.1", 30100)
			portmapMustNotReach(t, "host -> 127.0.0.1 without snat", got, err)
			if r := portmapRules(t); strings.Contains(r, "MASQUERADE") || strings.Contains(r, "masquerade") {
				t.Fatalf("snat off, yet masquerade rules:\n%s", r)
			}
			if err := p.att.Check(); err != nil {
				t.Fatalf("CHECK: %v", err)
			}
		})
		t.Run("masqall-"+backend, func(t *testing.T) {
			e := newPortmapEnv(t)
			keys := pmKeys(backend)
			keys["masqAll"] = true
			e.pod(t, e.list("1.1.0", "mwtp-masqall", keys), pmPort{30110, 80, "tcp", ""}, pmPort{30111, 81, "udp", ""})
			got, err := portmapTCP(e.outside, pmHost4, 30110)
			portmapMustReach(t, "outside tcp, masqAll", got, err, pmGw4)
			got, err = portmapUDP(e.outside, pmHost4, 30111)
			portmapMustReach(t, "outside udp, masqAll", got, err, pmGw4)
			got, err = portmapTCP(e.outside, pmHost6, 30110)
			portmapMustReach(t, "outside tcp IPv6, masqAll", got, err, pmGw6)
		})
	}
}

// TestPortmapDelWithoutMappings: DEL without portMappings and prevResult,
// under a renamed network, removes exactly this attachment's rules.
func TestPortmapDelWithoutMappings(t *testing.T) {
	for _, backend := range []string{"iptables", "nftables"} {
		t.Run(backend, func(t *testing.T) {
			e := newPortmapEnv(t)
			list := e.list("1.1.0", "mwtp-del", pmKeys(backend))
			keep := e.pod(t, list, pmPort{30200, 80, "tcp", ""})
			gone := e.pod(t, list, pmPort{30201, 80, "tcp", ""}, pmPort{30202, 81, "udp", ""})
			// The runtime renamed the network and forgot the mappings.
			keys := map[string]any{"cniVersion": "1.1.0", "name": "mwtp-renamed", "type": "portmap"}
			for k, v := range pmKeys(backend) {
				keys[k] = v
			}
			stdin, _ := json.Marshal(keys)
			env := map[string]string{"CNI_COMMAND": "DEL", "CNI_CONTAINERID": gone.att.RT.ContainerID, "CNI_NETNS": gone.ns.Path, "CNI_IFNAME": "eth0", "CNI_PATH": e.h.BinDir}
			for i := 0; i < 2; i++ {
				if r := e.h.Exec("portmap", env, stdin); r.ExitCode != 0 {
					t.Fatalf("DEL #%d: exit %d: %s %s", i+1, r.ExitCode, r.Stdout, r.Stderr)
				}
			}
			rules := portmapRules(t)
			if strings.Contains(rules, portmapKey(gone.att)) {
				t.Fatalf("rules of the deleted attachment remain:\n%s", rules)
			}
			if !strings.Contains(rules, portmapKey(keep.att)) {
				t.Fatalf("DEL removed another attachment's rules:\n%s", rules)
			}
			got, err := portmapTCP(e.outside, pmHost4, 30201)
			portmapMustNotReach(t, "deleted mapping", got, err)
			got, err = portmapTCP(e.outside, pmHost4, 30200)
			portmapMustReach(t, "remaining mapping", got, err, pmClient4)
		})
	}
}

// TestPortmapRenamedNetwork: ADD under one network name, DEL (through
// libcni, with the mappings) under another: nothing may leak (the leak
// check fails the test otherwise).
func TestPortmapRenamedNetwork(t *testing.T) {
	e := newPortmapEnv(t)
	p := e.pod(t, e.list("1.1.0", "mwtp-before", nil), pmPort{30300, 80, "tcp", ""})
	renamed := e.h.Attach(e.list("1.1.0", "mwtp-after", nil), p.ns, "eth0", portmapCaps(pmPort{30300, 80, "tcp", ""}))
	renamed.RT.ContainerID = p.att.RT.ContainerID
	// libcni has no cached result under the new name: DEL without prevResult.
	if err := renamed.Del(); err != nil {
		t.Fatalf("DEL under the new name: %v", err)
	}
	portmapAssertClean(t, "after DEL under the renamed network", p.att)
}

// TestPortmapGC: GC removes the attachments of its network missing from
// the valid list, keeps the valid ones and never touches another network.
func TestPortmapGC(t *testing.T) {
	for _, backend := range []string{"iptables", "nftables"} {
		t.Run(backend, func(t *testing.T) {
			e := newPortmapEnv(t)
			listA := e.list("1.1.0", "mwtp-gc-a", pmKeys(backend))
			listB := e.list("1.1.0", "mwtp-gc-b", pmKeys(backend))
			valid := e.pod(t, listA, pmPort{30400, 80, "tcp", ""})
			stale1 := e.pod(t, listA, pmPort{30401, 80, "tcp", ""})
			stale2 := e.pod(t, listA, pmPort{30402, 81, "udp", ""})
			other := e.pod(t, listB, pmPort{30403, 80, "tcp", ""})
			if err := e.h.GC(listA, valid.att.GCAttachment()); err != nil {
				t.Fatalf("GC: %v", err)
			}
			rules := portmapRules(t)
			for _, p := range []*pmPod{stale1, stale2} {
				if strings.Contains(rules, portmapKey(p.att)) {
					t.Fatalf("GC left a stale attachment %s:\n%s", portmapKey(p.att), rules)
				}
			}
			for _, p := range []*pmPod{valid, other} {
				if !strings.Contains(rules, portmapKey(p.att)) {
					t.Fatalf("GC removed %s:\n%s", portmapKey(p.att), rules)
				}
			}
			got, err := portmapTCP(e.outside, pmHost4, 30400)
			portmapMustReach(t, "valid attachment after GC", got, err, pmClient4)
			got, err = portmapTCP(e.outside, pmHost4, 30403)
			portmapMustReach(t, "other network after GC", got, err, pmClient4)
			got, err = portmapTCP(e.outside, pmHost4, 30401)
			portmapMustNotReach(t, "collected attachment", got, err)
			// GC with nothing valid in either network leaves no rule (the
			// valid list names a container that does not exist: host-local
			// refuses a GC without the key, which libcni omits when empty).
			nobody := e.h.Attach(listA, valid.ns, "eth9", nil).GCAttachment()
			if err := e.h.GC(listA, nobody); err != nil {
				t.Fatal(err)
			}
			if err := e.h.GC(listB, nobody); err != nil {
				t.Fatal(err)
			}
			portmapAssertClean(t, "after GC of everything", valid.att, stale1.att, stale2.att, other.att)
		})
	}
}

// TestPortmapConcurrent: 50 pods added and deleted at once, each with its
// own host port; every port reaches its own pod.
func TestPortmapConcurrent(t *testing.T) {
	for _, backend := range []string{"iptables", "nftables"} {
		t.Run(backend, func(t *testing.T) {
			e := newPortmapEnv(t)
			list := e.list("1.1.0", "mwtp-many", pmKeys(backend))
			const n = 50
			pods := make([]*pmPod, n)
			for i := range pods {
				pods[i] = e.unstartedPod(list, pmPort{30500 + i, 80, "tcp", ""})
			}
			errs := make([]error, n)
			var wg sync.WaitGroup
			for i, p := range pods {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r, err := p.att.Add()
					if err == nil {
						var cr *current.Result
						if cr, err = current.NewResultFromResult(r); err == nil {
							err = p.setAddrs(cr)
						}
					}
					errs[i] = err
				}()
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("ADD of pod %d: %v", i, err)
				}
			}
			e.waitBridgeReady(t)
			for i, p := range pods {
				portmapServe(t, p.ns)
				got, err := portmapTCP(e.outside, pmHost4, 30500+i)
				portmapMustReach(t, fmt.Sprintf("pod %d", i), got, err, pmClient4)
				if err := portmapOwner(p, got); err != nil {
					t.Fatal(err)
				}
			}
			for i, p := range pods {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = p.att.Del()
				}()
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Fatalf("DEL of pod %d: %v", i, err)
				}
			}
			var atts []*harness.Attachment
			for _, p := range pods {
				atts = append(atts, p.att)
			}
			portmapAssertClean(t, "after concurrent DELs", atts...)
		})
	}
}

// portmapOwner proves the answer came from the pod itself: the server is
// per namespace, so ask the pod's own address directly from the host.
func portmapOwner(p *pmPod, _ string) error {
	got, err := portmapTCP(nil, p.v4.String(), 80)
	if err != nil {
		return fmt.Errorf("pod %s not reachable directly: %v", p.v4, err)
	}
	if got != pmGw4 {
		return fmt.Errorf("pod %s saw %s from the host, want %s", p.v4, got, pmGw4)
	}
	return nil
}

// TestPortmapEveryVersion: ADD passes prevResult through unchanged, CHECK
// (0.4.0+) and DEL work with each spec version.
func TestPortmapEveryVersion(t *testing.T) {
	e := newPortmapEnv(t)
	for i, v := range version.All.SupportedVersions() {
		if !gte(v, "0.3.0") {
			continue // chaining needs 0.3.0
		}
		t.Run(v, func(t *testing.T) {
			list := e.list(v, fmt.Sprintf("mwtp-ver%d", i), nil)
			p := e.unstartedPod(list, pmPort{30600 + i, 80, "tcp", ""})
			res, err := p.att.Add()
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if res.Version() != v {
				t.Fatalf("result version %s, want %s", res.Version(), v)
			}
			cr, err := current.NewResultFromResult(res)
			if err != nil {
				t.Fatal(err)
			}
			p.addrs(t, cr)
			portmapServe(t, p.ns)
			got, err := portmapTCP(e.outside, pmHost4, 30600+i)
			portmapMustReach(t, "outside", got, err, pmClient4)
			if gte(v, "0.4.0") {
				if err := p.att.Check(); err != nil {
					t.Fatalf("CHECK: %v", err)
				}
			}
			if err := p.att.Del(); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			portmapAssertClean(t, "after DEL", p.att)
		})
	}
}

// TestPortmapCheckDetectsDrift: CHECK fails when the rules are gone or
// differ from the mappings.
func TestPortmapCheckDetectsDrift(t *testing.T) {
	for _, backend := range []string{"iptables", "nftables"} {
		t.Run(backend, func(t *testing.T) {
			e := newPortmapEnv(t)
			list := e.list("1.1.0", "mwtp-check", pmKeys(backend))
			p := e.pod(t, list, pmPort{30700, 80, "tcp", ""})
			if err := p.att.Check(); err != nil {
				t.Fatalf("CHECK: %v", err)
			}
			other := e.h.Attach(list, p.ns, "eth0", portmapCaps(pmPort{30701, 80, "tcp", ""}))
			other.RT.ContainerID = p.att.RT.ContainerID
			if err := other.Check(); err == nil || !strings.Contains(err.Error(), "30701") {
				t.Fatalf("CHECK with other mappings: %v, want a mismatch naming 30701", err)
			}
			key := portmapKey(p.att)
			if backend == "iptables" {
				_ = exec.Command("iptables", "-t", "nat", "-F", "MWHP-"+key).Run()
			} else {
				_ = exec.Command("nft", "flush", "chain", "inet", "meshwire_portmap", "pm-"+key).Run()
			}
			if err := p.att.Check(); err == nil {
				t.Fatal("CHECK passed with the attachment's rules flushed")
			}
		})
	}
}

// TestPortmapBadInput: conflicting options and a missing prevResult are
// refused with code 7 naming them, and change nothing.
func TestPortmapBadInput(t *testing.T) {
	h := harness.New(t)
	nodeBaseline(t)
	h.CheckNoLeaks()
	ns := h.NewNS("pm")
	prev := `"prevResult":{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","sandbox":"` + ns.Path + `"}],"ips":[{"address":"198.18.48.9/24","interface":0}]}`
	pms := `"runtimeConfig":{"portMappings":[{"hostPort":30800,"containerPort":80,"protocol":"tcp"}]}`
	cases := []struct {
		name, keys string
		mentions   []string
	}{
		{"no prevResult", pms, []string{"prevResult"}},
		{"mark bit and external chain", `"markMasqBit":13,"externalSetMarkChain":"X",` + pms + `,` + prev, []string{"markMasqBit", "externalSetMarkChain"}},
		{"nftables and external chain", `"backend":"nftables","externalSetMarkChain":"X",` + pms + `,` + prev, []string{"backend", "externalSetMarkChain"}},
		{"iptables and nft conditions", `"backend":"iptables","conditionsV4":["ip saddr 1.2.3.4"],` + pms + `,` + prev, []string{"conditionsV4"}},
		{"mark bit range", `"markMasqBit":40,` + pms + `,` + prev, []string{"markMasqBit"}},
		{"protocol", `"runtimeConfig":{"portMappings":[{"hostPort":30800,"containerPort":80,"protocol":"icmp"}]},` + prev, []string{"portMappings[0].protocol"}},
		{"backend", `"backend":"ipfw",` + pms + `,` + prev, []string{"backend"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stdin := `{"cniVersion":"1.1.0","name":"mwtp-bad","type":"portmap",` + c.keys + `}`
			r := h.Exec("portmap", map[string]string{"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1", "CNI_NETNS": ns.Path, "CNI_IFNAME": "eth0", "CNI_PATH": h.BinDir}, []byte(stdin))
			r.WantCNIError(t, 7, c.mentions...)
		})
	}
	portmapAssertClean(t, "after refused ADDs")
}

// TestPortmapUDPConntrackFlush: a client that sent UDP to the host port
// before it was mapped has a conntrack entry without NAT; ADD must flush
// it, or that client's datagrams would keep going to the host, not the pod.
// DEL flushes again, so the same client does not keep reaching a pod that
// is gone through the old entry.
func TestPortmapUDPConntrackFlush(t *testing.T) {
	for _, backend := range []string{"iptables", "nftables"} {
		t.Run(backend, func(t *testing.T) {
			e := newPortmapEnv(t)
			list := e.list("1.1.0", "mwtp-ct", pmKeys(backend))
			// Another pod's mapping keeps connection tracking on in the
			// host namespace (the kernel tracks only while a rule needs it).
			e.pod(t, list, pmPort{30151, 80, "tcp", ""})
			// One socket, one 5-tuple, for the whole test.
			c, err := probe.InNS(e.outside.Path, func() (net.Conn, error) {
				return net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP(pmClient4), Port: 40150}, &net.UDPAddr{IP: net.ParseIP(pmHost4), Port: 30150})
			})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ask := func() (string, error) {
				buf := make([]byte, 64)
				for i := 0; i < 3; i++ {
					if _, err := c.Write([]byte("hi\n")); err != nil {
						return "", err
					}
					_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
					if n, err := c.Read(buf); err == nil {
						return strings.TrimSpace(string(buf[:n])), nil
					}
				}
				return "", fmt.Errorf("no answer")
			}
			got, err := ask()
			portmapMustNotReach(t, "before the mapping", got, err)
			if out, err := harness.Run("conntrack", "-L", "-p", "udp", "--dport", "30150"); err != nil || !strings.Contains(out, "sport=40150") {
				t.Fatalf("no conntrack entry for the early datagrams (%v):\n%s", err, out)
			}
			p := e.pod(t, list, pmPort{30150, 81, "udp", ""})
			got, err = ask()
			portmapMustReach(t, "the same client after ADD", got, err, pmClient4)
			if err := p.att.Del(); err != nil {
				t.Fatal(err)
			}
			if out, _ := harness.Run("conntrack", "-L", "-p", "udp", "--dport", "30150"); strings.Contains(out, "sport=40150") {
				t.Fatalf("DEL left the client's conntrack entry:\n%s", out)
			}
		})
	}
}

// TestPortmapStatus: STATUS is ready with a working backend and code 50
// when the backend's tools cannot run.
func TestPortmapStatus(t *testing.T) {
	h := harness.New(t)
	for _, backend := range []string{"iptables", "nftables", "iptables-legacy"} {
		stdin := []byte(`{"cniVersion":"1.1.0","name":"mwtp-status","type":"portmap","backend":"` + backend + `"}`)
		if r := h.Exec("portmap", map[string]string{"CNI_COMMAND": "STATUS", "CNI_PATH": h.BinDir}, stdin); r.ExitCode != 0 {
			t.Fatalf("%s STATUS: exit %d: %s", backend, r.ExitCode, r.Stdout)
		}
		r := h.Exec("portmap", map[string]string{"CNI_COMMAND": "STATUS", "CNI_PATH": h.BinDir, "PATH": "/nonexistent"}, stdin)
		r.WantCNIError(t, 50, strings.SplitN(backend, "-", 2)[0]) // STATUS without the tools names the backend
	}
}

// TestPortmapForeignRules: rules that are not meshwire portmap's, in the
// same chains meshwire hooks into, survive ADD, GC and the teardown of the
// last attachment.
func TestPortmapForeignRules(t *testing.T) {
	e := newPortmapEnv(t)
	foreign := "-A PREROUTING -p tcp -m tcp --dport 30999 -m comment --comment mwtp-foreign -j RETURN"
	restore := func(line string) {
		if err := natRestore("iptables", line); err != nil {
			t.Fatalf("iptables-restore %q: %v", line, err)
		}
	}
	restore(foreign)
	t.Cleanup(func() { restore("-D" + strings.TrimPrefix(foreign, "-A")) })
	list := e.list("1.1.0", "mwtp-foreign", pmKeys("iptables"))
	p := e.pod(t, list, pmPort{30900, 80, "tcp", ""})
	nobody := e.h.Attach(list, p.ns, "eth9", nil).GCAttachment()
	if err := e.h.GC(list, nobody); err != nil {
		t.Fatal(err)
	}
	if err := p.att.Del(); err != nil {
		t.Fatal(err)
	}
	portmapAssertClean(t, "after GC and DEL", p.att)
	out, err := exec.Command("iptables-save", "-t", "nat").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "mwtp-foreign") {
		t.Fatalf("the foreign rule is gone (%v):\n%s", err, out)
	}
}

// TestPortmapTeardownRace: the last attachment's DEL (which removes the base
// chains) races the next pod's ADD, again and again; the new pod's port
// must work every time.
func TestPortmapTeardownRace(t *testing.T) {
	for _, backend := range []string{"iptables", "nftables"} {
		t.Run(backend, func(t *testing.T) {
			e := newPortmapEnv(t)
			list := e.list("1.1.0", "mwtp-race", pmKeys(backend))
			old := e.pod(t, list, pmPort{30160, 80, "tcp", ""})
			for i := 0; i < 12; i++ {
				port := 30161 + i%2
				next := e.unstartedPod(list, pmPort{port, 80, "tcp", ""})
				var addErr, delErr error
				var wg sync.WaitGroup
				wg.Add(2)
				go func() {
					defer wg.Done()
					r, err := next.att.Add()
					if err == nil {
						var cr *current.Result
						if cr, err = current.NewResultFromResult(r); err == nil {
							err = next.setAddrs(cr)
						}
					}
					addErr = err
				}()
				go func() { defer wg.Done(); delErr = old.att.Del() }()
				wg.Wait()
				if addErr != nil || delErr != nil {
					t.Fatalf("round %d: ADD %v, DEL %v", i, addErr, delErr)
				}
				portmapServe(t, next.ns)
				got, err := portmapTCP(e.outside, pmHost4, port)
				portmapMustReach(t, fmt.Sprintf("round %d", i), got, err, pmClient4)
				if err := next.att.Check(); err != nil {
					t.Fatalf("round %d CHECK: %v", i, err)
				}
				old = next
			}
			if err := old.att.Del(); err != nil {
				t.Fatal(err)
			}
			portmapAssertClean(t, "after the last DEL", old.att)
		})
	}
}
