// Package interceptenv builds the throwaway world the interception tests and
// benchmarks run in: a pod namespace (the app's servers, the test proxy as
// uid 1337, the rules iptables-init installs) and a remote namespace (echo
// and DNS servers) joined by a veth pair, with IPv4 and IPv6 addresses from
// meshwire's test ranges. Everything is removed at test cleanup.
package interceptenv

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/probe"
	"github.com/meshwire/meshwire/internal/proxylog"
	"github.com/meshwire/meshwire/test/harness"
)

// Addresses of the two namespaces (the pod's default routes point at the
// remote; Extra is a second remote address, off the shared subnet).
var (
	PodV4    = netip.MustParseAddr("198.18.64.2")
	RemoteV4 = netip.MustParseAddr("198.18.64.1")
	ExtraV4  = netip.MustParseAddr("198.18.65.1")
	PodV6    = netip.MustParseAddr("fd70:64::2")
	RemoteV6 = netip.MustParseAddr("fd70:64::1")
	ExtraV6  = netip.MustParseAddr("fd70:65::1")
)

// Ports the servers listen on.
const (
	AppPort      = 8000 // pod: captured inbound
	AppPort2     = 8001 // pod: for port lists and exclusions
	TunnelPort   = 15008
	StatusPort   = 15021 // pod: the sidecar's readiness port, never captured
	RemotePort   = 8080  // remote: captured outbound
	RemotePort2  = 9090  // remote: for port exclusions
	SinkPort     = 8090  // both: counts the bytes it receives (throughput)
	EchoPort     = 8082  // remote: an echo process of its own, when started (StartEcho)
	DNSPort      = 53
	ProxyUID     = 1337
	OtherUID     = 4242 // a user that is not the proxy
	ProxyOutPort = 15001
	ProxyInPort  = 15006
)

// Env is one pod namespace with its remote.
type Env struct {
	H      *harness.H
	T      testing.TB
	Pod    *harness.NS
	Remote *harness.NS
	Proxy  *Proxy

	mu          sync.Mutex
	remoteDNS   []string // sources of DNS queries the remote server saw
	closers     []io.Closer
	proxyBinary string
}

// New creates the namespaces, the veth pair (mwti0 in the pod, mwti1 in the
// remote), addresses, routes and the servers.
func New(t testing.TB, h *harness.H) *Env {
	t.Helper()
	e := &Env{H: h, T: t, Pod: h.NewNS("mwti-pod"), Remote: h.NewNS("mwti-rem")}
	t.Cleanup(func() {
		for _, c := range e.closers {
			c.Close()
		}
	})
	rf, err := os.Open(e.Remote.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer rf.Close()
	pnl, rnl := e.Pod.Netlink(), e.Remote.Netlink()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "mwti0"}, PeerName: "mwti1", PeerNamespace: netlink.NsFd(int(rf.Fd()))}
	if err := pnl.LinkAdd(veth); err != nil {
		t.Fatalf("create veth pair: %v", err)
	}
	e.setupLink(pnl, "mwti0", PodV4.String()+"/24", PodV6.String()+"/64")
	e.setupLink(rnl, "mwti1", RemoteV4.String()+"/24", RemoteV6.String()+"/64", ExtraV4.String()+"/32", ExtraV6.String()+"/128")
	pod0, _ := pnl.LinkByName("mwti0")
	for _, gw := range []netip.Addr{RemoteV4, RemoteV6} {
		r := &netlink.Route{LinkIndex: pod0.Attrs().Index, Gw: gw.AsSlice()}
		if err := pnl.RouteAdd(r); err != nil {
			t.Fatalf("default route via %s: %v", gw, err)
		}
	}
	for _, p := range []int{AppPort, AppPort2, TunnelPort, StatusPort} {
		e.serveEcho(e.Pod, p, "app")
	}
	for _, p := range []int{RemotePort, RemotePort2, DNSPort} {
		e.serveEcho(e.Remote, p, "remote")
	}
	e.serveSink(e.Pod)
	e.serveSink(e.Remote)
	for _, a := range []netip.Addr{RemoteV4, RemoteV6, ExtraV4, ExtraV6} {
		e.serveRemoteDNS(a)
	}
	return e
}

// setupLink puts addresses (without DAD) on a link and brings it and lo up.
func (e *Env) setupLink(nl *netns.Netlink, name string, addrs ...string) {
	t := e.T
	t.Helper()
	l, err := nl.LinkByName(name)
	if err != nil {
		t.Fatalf("link %s: %v", name, err)
	}
	for _, a := range addrs {
		p := netip.MustParsePrefix(a)
		ipn := &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
		if err := nl.AddrAdd(l, &netlink.Addr{IPNet: ipn, Flags: unix.IFA_F_NODAD}); err != nil {
			t.Fatalf("address %s on %s: %v", a, name, err)
		}
	}
	if err := nl.LinkSetUp(l); err != nil {
		t.Fatalf("up %s: %v", name, err)
	}
	lo, _ := nl.LinkByName("lo")
	if err := nl.LinkSetUp(lo); err != nil {
		t.Fatalf("up lo: %v", err)
	}
}

// VM addresses: a third namespace behind the pod's kube-virt interface
// mwtik0 (the pod's end, VMGateway) as a KubeVirt VM sits behind its pod.
var (
	VMGateway = netip.MustParseAddr("198.18.66.1")
	VMAddr    = netip.MustParseAddr("198.18.66.2")
)

// AddVM creates the VM namespace and its link to the pod (mwtik0 in the
// pod, mwtiv0 in the VM, default route via the pod).
func (e *Env) AddVM() *harness.NS {
	t := e.T
	t.Helper()
	vm := e.H.NewNS("mwti-vm")
	e.linkTo(e.Pod, vm, "mwtik0", "mwtiv0", VMGateway.String()+"/24", VMAddr.String()+"/24", VMGateway)
	// The pod routes the VM's traffic it does not capture (as KubeVirt's
	// pod network does), and the remote knows the way back.
	e.forward(e.Pod)
	r1, _ := e.Remote.Netlink().LinkByName("mwti1")
	vmNet := &net.IPNet{IP: VMAddr.AsSlice(), Mask: net.CIDRMask(24, 32)}
	vmNet.IP = vmNet.IP.Mask(vmNet.Mask)
	if err := e.Remote.Netlink().RouteAdd(&netlink.Route{LinkIndex: r1.Attrs().Index, Dst: vmNet, Gw: PodV4.AsSlice()}); err != nil {
		t.Fatalf("remote route to the VM: %v", err)
	}
	return vm
}

// Peer addresses: a namespace behind the remote, whose connections to the
// pod the remote routes (another pod of the node, as the node sees it).
var (
	PeerV4        = netip.MustParseAddr("198.18.67.2")
	PeerGatewayV4 = netip.MustParseAddr("198.18.67.1")
)

// AddPeer creates the peer namespace and its link to the remote (mwtip0
// in the remote, mwtip1 in the peer, default route via the remote), and
// turns on forwarding in the remote.
func (e *Env) AddPeer() *harness.NS {
	t := e.T
	t.Helper()
	peer := e.H.NewNS("mwti-peer")
	e.linkTo(e.Remote, peer, "mwtip0", "mwtip1", PeerGatewayV4.String()+"/24", PeerV4.String()+"/24", PeerGatewayV4)
	e.forward(e.Remote)
	return peer
}

// forward turns on IPv4 forwarding in ns.
func (e *Env) forward(ns *harness.NS) {
	e.T.Helper()
	if err := ns.Do(func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644) }); err != nil {
		e.T.Fatalf("forwarding in %s: %v", ns.Name, err)
	}
}

// linkTo links namespace from to a new namespace to with a veth pair
// (name in from with address fromAddr, peerName in to with toAddr) and
// gives to a default route via gw.
func (e *Env) linkTo(from, to *harness.NS, name, peerName, fromAddr, toAddr string, gw netip.Addr) {
	t := e.T
	t.Helper()
	tf, err := os.Open(to.Path)
	if err != nil {
		t.Fatal(err)
	}
	defer tf.Close()
	fnl, tnl := from.Netlink(), to.Netlink()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: peerName, PeerNamespace: netlink.NsFd(int(tf.Fd()))}
	if err := fnl.LinkAdd(veth); err != nil {
		t.Fatalf("create veth pair %s: %v", name, err)
	}
	e.setupLink(fnl, name, fromAddr)
	e.setupLink(tnl, peerName, toAddr)
	l, _ := tnl.LinkByName(peerName)
	if err := tnl.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: gw.AsSlice()}); err != nil {
		t.Fatalf("default route of %s: %v", to.Name, err)
	}
}

// Family-specific addresses.
func Pod(v6 bool) netip.Addr    { return pick(v6, PodV4, PodV6) }
func Remote(v6 bool) netip.Addr { return pick(v6, RemoteV4, RemoteV6) }
func Extra(v6 bool) netip.Addr  { return pick(v6, ExtraV4, ExtraV6) }

func pick(v6 bool, a, b netip.Addr) netip.Addr {
	if v6 {
		return b
	}
	return a
}

// AP joins an address and a port.
func AP(a netip.Addr, port int) netip.AddrPort { return netip.AddrPortFrom(a, uint16(port)) }

// Serve accepts TCP connections on port in ns and hands each to handle
// (which owns closing it) until the test ends.
func (e *Env) Serve(ns *harness.NS, port int, handle func(net.Conn)) {
	ln, err := probe.InNS(ns.Path, func() (net.Listener, error) { return net.Listen("tcp", ":"+strconv.Itoa(port)) })
	if err != nil {
		e.T.Fatalf("listen on %d in %s: %v", port, ns.Name, err)
	}
	e.closers = append(e.closers, ln)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
}

// serveEcho answers each line "MSG" with "WHO PEER MSG".
func (e *Env) serveEcho(ns *harness.NS, port int, who string) {
	e.Serve(ns, port, func(c net.Conn) {
		defer c.Close()
		peer := c.RemoteAddr().(*net.TCPAddr).AddrPort()
		peer = netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port())
		r := bufio.NewReader(c)
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return
			}
			if _, err := fmt.Fprintf(c, "%s %s %s", who, peer.Addr(), line); err != nil {
				return
			}
		}
	})
}

// serveSink reads each connection to its end and answers with the number
// of bytes it got.
func (e *Env) serveSink(ns *harness.NS) {
	e.Serve(ns, SinkPort, func(c net.Conn) {
		defer c.Close()
		n, _ := io.Copy(io.Discard, c)
		fmt.Fprintf(c, "%d\n", n)
	})
}

// serveRemoteDNS answers each UDP datagram to addr:53 in the remote with
// "remote-dns:" + the query (from addr, as a resolver does), and remembers
// who asked.
func (e *Env) serveRemoteDNS(addr netip.Addr) {
	pc, err := probe.InNS(e.Remote.Path, func() (net.PacketConn, error) {
		return net.ListenPacket("udp", AP(addr, DNSPort).String())
	})
	if err != nil {
		e.T.Fatalf("listen udp 53 in the remote: %v", err)
	}
	e.closers = append(e.closers, pc)
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			src := from.(*net.UDPAddr).AddrPort().Addr().Unmap()
			e.mu.Lock()
			e.remoteDNS = append(e.remoteDNS, src.String())
			e.mu.Unlock()
			_, _ = pc.WriteTo(append([]byte("remote-dns:"), buf[:n]...), from)
		}
	}()
}

// RemoteDNSSources returns who asked the remote DNS server so far.
func (e *Env) RemoteDNSSources() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]string(nil), e.remoteDNS...)
}

// Request sends one line over TCP from inside ns (as the test process: root,
// not the proxy) and returns the reply line. The socket's peer
// (getpeername) must be dst, captured or not, as it is with the rules'
// NAT.
func Request(ns *harness.NS, dst netip.AddrPort, msg string) (string, error) {
	c, err := probe.InNS(ns.Path, func() (net.Conn, error) { return net.DialTimeout("tcp", dst.String(), 3*time.Second) })
	if err != nil {
		return "", err
	}
	defer c.Close()
	if peer := unmapped(c.RemoteAddr().(*net.TCPAddr).AddrPort()); peer != dst {
		return "", fmt.Errorf("the connection's peer is %s, not %s", peer, dst)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// Dial opens a TCP connection from inside ns.
func Dial(ns *harness.NS, dst netip.AddrPort) (*net.TCPConn, error) {
	c, err := probe.InNS(ns.Path, func() (net.Conn, error) { return net.DialTimeout("tcp", dst.String(), 3*time.Second) })
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// UDP sockets a query is sent from, as resolvers use them.
type QuerySocket int

const (
	Connected   QuerySocket = iota // connect(), send, recv (Go, glibc)
	Unconnected                    // sendto, recvfrom on a socket of dst's family (musl)
	DualStack                      // sendto, recvfrom on an IPv6 socket, IPv4 as v4-mapped
)

func (k QuerySocket) String() string {
	return [...]string{"connected", "unconnected", "dual-stack"}[k]
}

// Query sends one UDP datagram from inside ns from a socket of kind k and
// returns the answer and where it came from as the app sees it (for a
// connected socket, its peer as getpeername has it).
func Query(ns *harness.NS, k QuerySocket, dst netip.AddrPort, msg string) (string, netip.AddrPort, error) {
	network := "udp4"
	switch {
	case k == DualStack:
		network = "udp" // an IPv6 socket, not IPv6 only
	case dst.Addr().Is6():
		network = "udp6"
	}
	if k == Connected {
		c, err := probe.InNS(ns.Path, func() (net.Conn, error) { return net.Dial("udp", dst.String()) })
		if err != nil {
			return "", netip.AddrPort{}, err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := io.WriteString(c, msg); err != nil {
			return "", netip.AddrPort{}, err
		}
		buf := make([]byte, 2048)
		n, err := c.Read(buf)
		return string(buf[:n]), unmapped(c.RemoteAddr().(*net.UDPAddr).AddrPort()), err
	}
	c, err := probe.InNS(ns.Path, func() (*net.UDPConn, error) {
		return net.ListenUDP(network, nil)
	})
	if err != nil {
		return "", netip.AddrPort{}, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	to := dst
	if k == DualStack {
		to = netip.AddrPortFrom(netip.AddrFrom16(dst.Addr().As16()), dst.Port())
	}
	if _, err := c.WriteToUDPAddrPort([]byte(msg), to); err != nil {
		return "", netip.AddrPort{}, err
	}
	buf := make([]byte, 2048)
	n, from, err := c.ReadFromUDPAddrPort(buf)
	return string(buf[:n]), unmapped(from), err
}

func unmapped(a netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(a.Addr().Unmap(), a.Port())
}

// IptablesInit runs the built iptables-init in the pod namespace (as an init
// container runs: started inside it) and returns its exit status and output.
func (e *Env) IptablesInit(args ...string) (int, string) {
	e.T.Helper()
	return e.IptablesInitEnv(nil, args...)
}

// IptablesInitEnv is IptablesInit with variables ("NAME=value") added to
// the test's environment, as a pod spec's env adds them. The pod is dual
// stack with an IPv4 first address: like Istio's injector on a dual-stack
// cluster, the environment has ISTIO_DUAL_STACK=true unless env sets it.
func (e *Env) IptablesInitEnv(env []string, args ...string) (int, string) {
	e.T.Helper()
	return e.IptablesInitIn(e.Pod, env, args...)
}

// IptablesInitIn is IptablesInitEnv in namespace ns (the remote, made a
// meshed pod of its own).
func (e *Env) IptablesInitIn(ns *harness.NS, env []string, args ...string) (int, string) {
	e.T.Helper()
	cmd := exec.Command(filepath.Join(e.H.BinDir, "iptables-init"), args...)
	cmd.Env = append(append([]string{"ISTIO_DUAL_STACK=true"}, os.Environ()...), env...)
	var buf strings.Builder
	cmd.Stdout, cmd.Stderr = &buf, &buf
	err := ns.Do(cmd.Run)
	out := buf.String()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		e.T.Fatalf("run iptables-init: %v", err)
	}
	return 0, string(out)
}

// MustIptablesInit runs iptables-init and fails the test unless it exits 0.
func (e *Env) MustIptablesInit(args ...string) string {
	e.T.Helper()
	code, out := e.IptablesInit(args...)
	if code != 0 {
		e.T.Fatalf("iptables-init %s: exit %d\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// binary returns the path of a test program (bin/test/NAME under `make`,
// NAME in the harness' own build).
func (e *Env) binary(name string) string {
	for _, p := range []string{filepath.Join(e.H.BinDir, "test", name), filepath.Join(e.H.BinDir, name)} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	e.T.Fatalf("test program %s not built in %s", name, e.H.BinDir)
	return ""
}

// proxyCopy puts the test proxy where any uid can run it (the harness'
// build directory is private to root).
func (e *Env) proxyCopy() string {
	if e.proxyBinary != "" {
		return e.proxyBinary
	}
	dir, err := os.MkdirTemp("", "mwti-proxy-")
	if err != nil {
		e.T.Fatal(err)
	}
	e.T.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		e.T.Fatal(err)
	}
	data, err := os.ReadFile(e.binary("proxy"))
	if err != nil {
		e.T.Fatal(err)
	}
	p := filepath.Join(dir, "proxy")
	if err := os.WriteFile(p, data, 0o755); err != nil {
		e.T.Fatal(err)
	}
	e.proxyBinary = p
	return p
}

// command prepares the test proxy binary to run as uid/gid (with
// CAP_NET_ADMIN as an ambient capability when netAdmin is set); callers
// start it from a thread inside the pod namespace (Pod.Do), so the child
// starts there.
func (e *Env) command(uid, gid uint32, netAdmin bool, args ...string) *exec.Cmd {
	cmd := exec.Command(e.proxyCopy(), args...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: gid}}
	if netAdmin {
		cmd.SysProcAttr.AmbientCaps = []uintptr{unix.CAP_NET_ADMIN}
	}
	return cmd
}

// DialAs makes one request from the pod as uid/gid (through `proxy dial`).
func (e *Env) DialAs(uid, gid uint32, dst netip.AddrPort, msg string) (string, error) {
	return e.runInPod(e.command(uid, gid, false, "dial", dst.String(), msg))
}

// DialFrom is DialAs from a socket bound to from with IP_TRANSPARENT and
// SO_MARK mark (0: none), as Envoy's original_src filter opens its
// upstream connections (CAP_NET_ADMIN, ambient, for both).
func (e *Env) DialFrom(uid, gid uint32, from netip.Addr, mark int, dst netip.AddrPort, msg string) (string, error) {
	return e.runInPod(e.command(uid, gid, true, "dial", "-from", from.String(), "-mark", strconv.Itoa(mark), dst.String(), msg))
}

// runInPod starts cmd in the pod's namespace and returns its output,
// trimmed, or its error with what it wrote on stderr.
func (e *Env) runInPod(cmd *exec.Cmd) (string, error) {
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := e.Pod.Do(cmd.Start); err != nil {
		return "", err
	}
	if err := cmd.Wait(); err != nil {
		return "", fmt.Errorf("%v: %s", err, errb.String())
	}
	return strings.TrimSpace(out.String()), nil
}

// Proxy is the running test proxy.
type Proxy struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	recs []Record
	cond *sync.Cond
	done bool
}

// Record is one line of the proxy's log.
type Record = proxylog.Record

// StartProxy starts the test proxy in the pod as uid/gid 1337 (with
// CAP_NET_ADMIN for TPROXY), forwarding captured DNS to the remote; extra
// flags (-copy splice, -answer) are passed on.
func (e *Env) StartProxy(tproxy bool, extra ...string) *Proxy {
	e.T.Helper()
	return e.StartProxyAs(ProxyUID, ProxyUID, tproxy, extra...)
}

// StartProxyAs is StartProxy with the proxy running as uid/gid (a proxy
// matched by its gid only, or a process of another uid on the proxy's
// ports).
func (e *Env) StartProxyAs(uid, gid uint32, tproxy bool, extra ...string) *Proxy {
	e.T.Helper()
	e.Proxy = e.StartProxyIn(e.Pod, uid, gid, tproxy, extra...)
	return e.Proxy
}

// StartProxyIn is StartProxyAs in namespace ns, without making it the
// pod's proxy (e.Proxy): the remote's sidecar, when the remote is made a
// meshed pod of its own. It is killed when the test ends.
func (e *Env) StartProxyIn(ns *harness.NS, uid, gid uint32, tproxy bool, extra ...string) *Proxy {
	e.T.Helper()
	mode := "redirect"
	if tproxy {
		mode = "tproxy"
	}
	args := append([]string{"-mode", mode, "-dns-upstream", AP(RemoteV4, DNSPort).String()}, extra...)
	return e.start(ns, e.command(uid, gid, tproxy, args...), "the test proxy")
}

// StartEcho runs `proxy echo NETWORK ADDR` in ns as uid/gid: an echo
// server in a process of its own, as a remote pod's app is (the servers
// New starts run in the test's own process). It is killed when the test
// ends, or by Stop.
func (e *Env) StartEcho(ns *harness.NS, uid, gid uint32, network, addr string) *Proxy {
	e.T.Helper()
	return e.start(ns, e.command(uid, gid, false, "echo", network, addr), "the echo server")
}

// StartZtunnel runs the test proxy as a ztunnel stand-in (-zds PATH, the
// node agent's ZDS socket) as root in the test's own namespace, the
// node's, as ztunnel runs: it listens in the pods the agent hands it.
// extra flags are passed on.
func (e *Env) StartZtunnel(socket string, extra ...string) *Proxy {
	e.T.Helper()
	cmd := exec.Command(e.binary("proxy"), append([]string{"-zds", socket}, extra...)...)
	return e.start(nil, cmd, "the ztunnel stand-in")
}

// start runs the test proxy binary as cmd in ns (nil: the test's own
// namespace) and waits until it says it is ready.
func (e *Env) start(ns *harness.NS, cmd *exec.Cmd, what string) *Proxy {
	e.T.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		e.T.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	p := &Proxy{cmd: cmd}
	p.cond = sync.NewCond(&p.mu)
	start := cmd.Start
	if ns != nil {
		start = func() error { return ns.Do(cmd.Start) }
	}
	if err := start(); err != nil {
		e.T.Fatalf("start %s: %v", what, err)
	}
	e.T.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var r Record
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				p.mu.Lock()
				p.recs = append(p.recs, r)
				p.cond.Broadcast()
				p.mu.Unlock()
			}
		}
		p.mu.Lock()
		p.done = true
		p.cond.Broadcast()
		p.mu.Unlock()
	}()
	p.mu.Lock()
	for !p.done && !p.has(func(r Record) bool { return r.Event == "ready" || r.Event == "error" }) {
		p.cond.Wait()
	}
	recs := append([]Record(nil), p.recs...)
	p.mu.Unlock()
	for _, r := range recs {
		if r.Event == "error" {
			e.T.Fatalf("%s failed to start: %s", what, r.Err)
		}
	}
	if len(recs) == 0 {
		e.T.Fatalf("%s exited before it was ready", what)
	}
	return p
}

// StopProxy ends the running test proxy (so another can start).
func (e *Env) StopProxy() {
	if e.Proxy == nil {
		return
	}
	e.Proxy.Stop()
	e.Proxy = nil
}

// Stop ends the proxy.
func (p *Proxy) Stop() {
	_ = p.cmd.Process.Kill()
	_ = p.cmd.Wait()
}

// Pid is the process id of the proxy (or echo server).
func (p *Proxy) Pid() int { return p.cmd.Process.Pid }

func (p *Proxy) has(pred func(Record) bool) bool {
	for _, r := range p.recs {
		if pred(r) {
			return true
		}
	}
	return false
}

// Mark returns the number of records so far, for Since.
func (p *Proxy) Mark() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.recs)
}

// Since returns the connection and DNS records after mark. It first has
// the proxy print a sync line (SIGUSR1) and waits for it, so that every
// connection the proxy accepted so far is in.
func (p *Proxy) Since(mark int) []Record {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.recs)
	if err := p.cmd.Process.Signal(syscall.SIGUSR1); err == nil {
		timer := time.AfterFunc(5*time.Second, func() {
			p.mu.Lock()
			p.done = true
			p.cond.Broadcast()
			p.mu.Unlock()
		})
		defer timer.Stop()
		for !p.done && !synced(p.recs[n:]) {
			p.cond.Wait()
		}
	}
	var out []Record
	for _, r := range p.recs[mark:] {
		if r.Event != "ready" && r.Event != "sync" {
			out = append(out, r)
		}
	}
	return out
}

func synced(recs []Record) bool {
	for _, r := range recs {
		if r.Event == "sync" {
			return true
		}
	}
	return false
}

// Await returns the first record so far or within timeout that match
// accepts; false when none came.
func (p *Proxy) Await(match func(Record) bool, timeout time.Duration) (Record, bool) {
	return p.AwaitSince(0, match, timeout)
}

// AwaitSince is Await over the records after mark (from Mark).
func (p *Proxy) AwaitSince(mark int, match func(Record) bool, timeout time.Duration) (Record, bool) {
	deadline := time.Now().Add(timeout)
	for {
		p.mu.Lock()
		for _, r := range p.recs[mark:] {
			if match(r) {
				p.mu.Unlock()
				return r, true
			}
		}
		p.mu.Unlock()
		if time.Now().After(deadline) {
			return Record{}, false
		}
		time.Sleep(10 * time.Millisecond)
	}
}
