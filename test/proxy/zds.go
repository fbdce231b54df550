package main

// The ztunnel stand-in (-zds PATH). ztunnel, in Istio ambient mode, runs
// once per node, outside the pods, and gets each enrolled pod's network
// namespace from the node agent over ZDS (internal/zds). In each one it
// opens the listeners that the agent's in-pod rules (internal/ambient)
// send the pod's traffic to. This stand-in does the same with plain TCP:
//
//   - 15001 outbound: REDIRECTed; forwarded to the original destination
//     (SO_ORIGINAL_DST) from a socket in the pod with mark 0x539, which
//     the rules let out;
//   - 15006 inbound plaintext: REDIRECTed by Istio's rules (the original
//     destination from SO_ORIGINAL_DST, else the socket's local address,
//     as after TPROXY); the listener is IP_TRANSPARENT, as ztunnel's.
//     Forwarded to the app with mark 0x539 and, as ztunnel does, from the
//     client's own address (IP_TRANSPARENT bind): the app's replies come
//     back to the stand-in only with istio-cni's in-pod policy route
//     (fwmark 0x111 to a local table);
//   - 15008 HBONE (-hbone PORT, 0: none): a plain TCP listener that logs
//     each connection and closes it (no mTLS, no HTTP/2 CONNECT);
//   - 15053 DNS, UDP on loopback and TCP, unless -dns 0: answered as the
//     proxy's own DNS capture, the upstream asked with mark 0x539.
//
// Each on IPv4 and, when the pod's namespace has IPv6, IPv6. A workload
// added twice (a snapshot replayed after a reconnect) is kept as it is;
// DelWorkload, or a snapshot without it, closes its listeners and
// connections; the snapshot's end is logged ("snapshot"). When the agent goes away, the stand-in keeps its
// workloads and reconnects with backoff.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/zds"
)

// runZDS connects to the agent's socket for ever, reconnecting with
// backoff.
func runZDS(path string, dns bool, upstream string, hbone int) {
	z := &ztunnel{dns: dns, upstream: upstream, hbone: hbone, pods: map[string]*workload{}}
	sync := syncOnSignal()
	emit(Record{Event: "ready"})
	go sync()
	backoff := 100 * time.Millisecond
	for {
		c, err := zds.Dial(path)
		if err != nil {
			time.Sleep(backoff)
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		backoff = 100 * time.Millisecond
		z.seen = map[string]bool{}
		if err := c.Serve(context.Background(), z); err != nil {
			emit(Record{Event: "error", Err: err.Error()})
		}
		c.Close()
	}
}

// ztunnel is the stand-in's zds.Handler; the client calls it from one
// goroutine.
type ztunnel struct {
	dns      bool
	upstream string
	hbone    int
	pods     map[string]*workload
	seen     map[string]bool // added or kept since the connection began
}

func (z *ztunnel) Add(uid string, _ *zds.WorkloadInfo, netns *os.File) error {
	z.seen[uid] = true
	if _, ok := z.pods[uid]; ok {
		// A snapshot replayed (the agent restarted, or reconnected):
		// the workload's listeners stay as they are.
		netns.Close()
		emit(Record{Event: "held", Workload: uid})
		return nil
	}
	w, err := z.start(uid, netns)
	if err != nil {
		return err
	}
	z.pods[uid] = w
	emit(Record{Event: "add", Workload: uid})
	return nil
}

func (z *ztunnel) Keep(uid string) error {
	z.seen[uid] = true
	return nil
}

func (z *ztunnel) Del(uid string) error {
	if w, ok := z.pods[uid]; ok {
		w.close()
		delete(z.pods, uid)
		emit(Record{Event: "del", Workload: uid})
	}
	return nil
}

// SnapshotSent drops what the snapshot lacked, then logs "snapshot":
// the agent that connected has told the stand-in all it enrolls.
func (z *ztunnel) SnapshotSent() error {
	for uid := range z.pods {
		if !z.seen[uid] {
			_ = z.Del(uid)
		}
	}
	emit(Record{Event: "snapshot"})
	return nil
}

// workload is one pod's listeners and connections.
type workload struct {
	uid   string
	netns ns.NetNS

	mu     sync.Mutex
	open   map[io.Closer]bool // listeners and connections
	closed bool
}

// id is the workload's uid, "" for the proxy's own listeners (w nil).
func (w *workload) id() string {
	if w == nil {
		return ""
	}
	return w.uid
}

// track registers c to be closed with the workload; false (c closed) when
// the workload is already gone.
func (w *workload) track(c io.Closer) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		c.Close()
		return false
	}
	w.open[c] = true
	return true
}

func (w *workload) untrack(c io.Closer) {
	if w == nil {
		return
	}
	w.mu.Lock()
	delete(w.open, c)
	w.mu.Unlock()
}

func (w *workload) close() {
	w.mu.Lock()
	w.closed = true
	open := w.open
	w.open = nil
	w.mu.Unlock()
	for c := range open {
		c.Close()
	}
	w.netns.Close()
}

// start opens the workload's listeners inside its namespace. ns.Do runs
// the function on a locked OS thread switched into the namespace and
// switches it back (a thread it cannot switch back is never reused);
// sockets stay in the namespace they were created in.
func (z *ztunnel) start(uid string, f *os.File) (*workload, error) {
	netns, err := ns.GetNS(fmt.Sprintf("/proc/self/fd/%d", f.Fd()))
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("netns of %s: %w", uid, err)
	}
	w := &workload{uid: uid, netns: netns, open: map[io.Closer]bool{}}
	type tcpListener struct {
		port        int
		name        string
		transparent bool
	}
	tcp := []tcpListener{
		{ambient.OutboundPort, "outbound", false},
		{ambient.InboundPlaintextPort, "inbound", true},
	}
	if z.hbone != 0 {
		tcp = append(tcp, tcpListener{z.hbone, "hbone", false})
	}
	if z.dns {
		tcp = append(tcp, tcpListener{ambient.DNSPort, "dns-tcp", false})
	}
	err = netns.Do(func(ns.NetNS) error {
		for _, fam := range []string{"tcp4", "tcp6"} {
			if fam == "tcp6" && !hasIPv6() {
				continue
			}
			for _, l := range tcp {
				ln, err := listen(fam, l.port, l.transparent)
				if err != nil {
					return err
				}
				w.track(ln)
				go serve(ln, l.name, false, w)
			}
			if z.dns {
				udp, lo := "udp4", "127.0.0.1"
				if fam == "tcp6" {
					udp, lo = "udp6", "::1"
				}
				pc, err := net.ListenPacket(udp, net.JoinHostPort(lo, strconv.Itoa(ambient.DNSPort)))
				if err != nil {
					return err
				}
				w.track(pc)
				go serveDNS(pc, z.upstream, w)
			}
		}
		return nil
	})
	if err != nil {
		w.close()
		return nil, fmt.Errorf("listen in the netns of %s: %w", uid, err)
	}
	return w, nil
}

// hasIPv6 reports whether the current namespace has IPv6 (::1 on lo).
func hasIPv6() bool {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// forward connects c to its original destination from inside the pod
// and copies both ways. Inbound, from the client's address.
func (w *workload) forward(c *net.TCPConn, name string, src, dst netip.AddrPort, rec Record) {
	if name == "hbone" {
		return
	}
	var spoof netip.AddrPort
	if name == "inbound" {
		spoof = netip.AddrPortFrom(src.Addr(), 0)
	}
	up, err := w.dial(dst.String(), spoof)
	if err != nil {
		rec.Event, rec.Err = "error", err.Error()
		emit(rec)
		return
	}
	defer up.Close()
	if !w.track(up) {
		return
	}
	defer w.untrack(up)
	pipe(c, up.(*net.TCPConn))
}

// dialMarked dials from inside the pod with ztunnel's mark.
func (w *workload) dialMarked(network, addr string) (net.Conn, error) {
	var c net.Conn
	err := w.netns.Do(func(ns.NetNS) error {
		var err error
		c, err = markedDialer(netip.AddrPort{}).Dial(network, addr)
		return err
	})
	return c, err
}

// dial connects to addr over TCP from inside the pod with ztunnel's
// mark, from src when it is valid (IP_TRANSPARENT).
func (w *workload) dial(addr string, src netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := w.netns.Do(func(ns.NetNS) error {
		var err error
		c, err = markedDialer(src).Dial("tcp", addr)
		return err
	})
	return c, err
}

func markedDialer(src netip.AddrPort) *net.Dialer {
	d := &net.Dialer{Timeout: 5 * time.Second}
	transparent := src.IsValid()
	if transparent {
		d.LocalAddr = net.TCPAddrFromAddrPort(src)
	}
	d.Control = func(network, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, ambient.Mark)
			if serr != nil || !transparent {
				return
			}
			if network == "tcp6" {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
			} else {
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
			}
		})
		return errors.Join(err, serr)
	}
	return d
}
