// Command proxy is meshwire's transparent test proxy (not shipped): it stands
// in for a service-mesh sidecar in end-to-end tests and benchmarks of the
// interception rules. It listens on the capture ports, reads each
// connection's original destination (SO_ORIGINAL_DST for REDIRECT, the
// socket's local address for TPROXY), prints one JSON line per connection on
// stdout, and forwards the bytes to that destination: outbound directly,
// inbound from the passthrough source address (127.0.0.6 or ::6), as a
// sidecar does. It also answers DNS captured to port 15053 by forwarding the
// query upstream and prefixing the answer with "proxy:".
//
// Run it as the proxy's uid (1337), in the pod's network namespace; TPROXY
// needs CAP_NET_ADMIN (an ambient capability) for IP_TRANSPARENT.
//
//	proxy [-mode redirect|tproxy] [-outbound 15001] [-inbound 15006] [-dns 15053 -dns-upstream ADDR:53] [-copy loop|splice] [-answer|-sink] [-unix PATH [-unix-to PATH]] [-status PORT]
//	proxy -zds /var/run/ztunnel/ztunnel.sock [-hbone 15008|0] [-dns 15053|0 -dns-upstream ADDR:53] [-copy loop|splice] [-answer]
//
// -copy splice copies with io.Copy between the two TCP connections, which
// Go turns into splice(2) (the receiver the sockmap fast path must not
// starve); -answer echoes each captured connection's bytes back itself
// instead of forwarding them (the app <-> sidecar hop alone); -sink reads
// each captured connection to its end with the copy loop's reads (64 KiB)
// and answers with the number of bytes it got, as the benchmarks' remote
// sink does (the hop's bulk throughput, app -> sidecar alone).
//
// -unix PATH also listens on a Unix stream socket at PATH and echoes what
// it gets there, or with -unix-to forwards it to the Unix socket at that
// path: the same process and copy loop with no TCP, no netfilter and no
// BPF on the way, which the benchmarks time beside the interception modes.
//
// -zds PATH makes it a ztunnel stand-in for Istio ambient mode (zds.go):
// it listens in no namespace of its own but in each pod's that the node
// agent hands it over ZDS, on ztunnel's in-pod ports.
//
// -status PORT answers HTTP 200 "ready" on every path of PORT, as Envoy's
// status port (15021, /healthz/ready) does for kubelet's probes; those
// connections are not logged (what reaches it was not captured).
//
//	proxy dial [-from ADDR] [-mark N] ADDR MESSAGE   # one request as the current user: prints the reply
//	proxy echo tcp|unix ADDR  # an echo server as its own process (a remote app)
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/origdst"
	"github.com/meshwire/meshwire/internal/proxylog"
)

// Record is what the proxy prints for each connection or DNS query.
type Record = proxylog.Record

var (
	answer     bool // echo instead of forwarding
	sinkOnly   bool // count the bytes and answer with the count instead of forwarding
	spliceCopy bool // copy with io.Copy (splice) instead of a read/write loop

	outMu sync.Mutex
	enc   = json.NewEncoder(os.Stdout)
)

func emit(r Record) {
	r.UID = os.Getuid()
	outMu.Lock()
	defer outMu.Unlock()
	_ = enc.Encode(r)
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "dial" {
		os.Exit(dial(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "echo" {
		echo(os.Args[2:])
		return
	}
	mode := flag.String("mode", "redirect", "inbound interception mode: redirect or tproxy")
	outPort := flag.Int("outbound", 15001, "outbound capture port")
	inPort := flag.Int("inbound", 15006, "inbound capture port")
	dnsPort := flag.Int("dns", 15053, "DNS capture port (0: none)")
	upstream := flag.String("dns-upstream", "", "DNS server to forward captured queries to")
	copyMode := flag.String("copy", "loop", "how bytes are copied: loop (read/write) or splice (io.Copy)")
	flag.BoolVar(&answer, "answer", false, "echo captured connections back instead of forwarding them")
	flag.BoolVar(&sinkOnly, "sink", false, "read captured connections to their end and answer with the byte count instead of forwarding them")
	unixPath := flag.String("unix", "", "also listen on a Unix stream socket at this path (a benchmark reference)")
	unixTo := flag.String("unix-to", "", "forward what -unix accepts to the Unix socket at this path instead of echoing it")
	statusPort := flag.Int("status", 0, "answer HTTP 200 on this port, as a sidecar's status port (0: none)")
	zdsPath := flag.String("zds", "", "be a ztunnel stand-in: take pods' netns from the node agent's ZDS socket at this path and listen in each")
	hbone := flag.Int("hbone", 15008, "with -zds: HBONE port to listen on in each pod (0: none)")
	flag.Parse()
	switch *copyMode {
	case "loop":
	case "splice":
		spliceCopy = true
	default:
		fatal(fmt.Errorf("-copy %q: want loop or splice", *copyMode))
	}
	if answer && sinkOnly {
		fatal(fmt.Errorf("-answer and -sink: choose one"))
	}
	tproxy := *mode == "tproxy"
	if *zdsPath != "" {
		runZDS(*zdsPath, *dnsPort != 0, *upstream, *hbone)
		return
	}

	var lns []net.Listener
	for _, fam := range []string{"tcp4", "tcp6"} {
		out, err := listen(fam, *outPort, false)
		if err != nil {
			fatal(err)
		}
		in, err := listen(fam, *inPort, tproxy)
		if err != nil {
			fatal(err)
		}
		lns = append(lns, out, in)
		go serve(out, "outbound", false, nil)
		go serve(in, "inbound", tproxy, nil)
		if *dnsPort != 0 {
			d, err := listen(fam, *dnsPort, false)
			if err != nil {
				fatal(err)
			}
			go serve(d, "dns-tcp", false, nil)
			// On loopback, where REDIRECT sends the app's queries, so
			// that answers leave from the address conntrack expects.
			udp, lo := "udp4", "127.0.0.1"
			if fam == "tcp6" {
				udp, lo = "udp6", "::1"
			}
			pc, err := net.ListenPacket(udp, net.JoinHostPort(lo, strconv.Itoa(*dnsPort)))
			if err != nil {
				fatal(err)
			}
			go serveDNS(pc, *upstream, nil)
		}
	}
	if *unixPath != "" {
		ln, err := net.Listen("unix", *unixPath)
		if err != nil {
			fatal(err)
		}
		go serveUnix(ln, *unixTo)
	} else if *unixTo != "" {
		fatal(fmt.Errorf("-unix-to needs -unix"))
	}
	if *statusPort != 0 {
		ln, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(*statusPort)))
		if err != nil {
			fatal(err)
		}
		go func() {
			_ = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				_, _ = io.WriteString(w, "ready\n")
			}))
		}()
	}
	sync := syncOnSignal()
	emit(Record{Event: "ready"})
	sync()
}

// syncOnSignal takes SIGUSR1 (before "ready": a test may signal right
// after it) and returns the loop that answers it with a "sync" line, for
// ever: every record of a connection that was accepted before the signal
// is printed before it.
func syncOnSignal() func() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGUSR1)
	return func() {
		for range sig {
			emit(Record{Event: "sync"})
		}
	}
}

func fatal(err error) {
	emit(Record{Event: "error", Err: err.Error()})
	os.Exit(1)
}

func anyAddr(fam string) string {
	if fam == "tcp6" || fam == "udp6" {
		return "::"
	}
	return "0.0.0.0"
}

func listen(fam string, port int, transparent bool) (net.Listener, error) {
	lc := net.ListenConfig{}
	if transparent {
		lc.Control = func(network, address string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				if fam == "tcp6" {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
				} else {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
				}
			})
			if err != nil {
				return err
			}
			if serr != nil {
				return fmt.Errorf("IP_TRANSPARENT (needs CAP_NET_ADMIN): %w", serr)
			}
			return nil
		}
	}
	return lc.Listen(nil, fam, net.JoinHostPort(anyAddr(fam), strconv.Itoa(port)))
}

// serve handles the connections ln accepts: the proxy's own listeners
// (w nil), or those of a workload handed over ZDS.
func serve(ln net.Listener, name string, tproxy bool, w *workload) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go handle(c.(*net.TCPConn), name, tproxy, w)
	}
}

func handle(c *net.TCPConn, name string, tproxy bool, w *workload) {
	defer c.Close()
	if w != nil && !w.track(c) {
		return
	}
	defer w.untrack(c)
	// A REDIRECTed connection (every outbound one, and inbound ones in
	// REDIRECT mode) carries its original destination in conntrack; one
	// TPROXY handed over was never rewritten: its local address is it.
	dst, err := origdst.Redirected(c)
	if err != nil && (tproxy || w != nil) {
		dst, err = origdst.Local(c), nil
	}
	src := c.RemoteAddr().(*net.TCPAddr).AddrPort()
	src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
	rec := Record{Event: "conn", Listener: name, Src: src.String(), OrigDst: dst.String(), Workload: w.id()}
	if err != nil {
		rec.Err = err.Error()
		emit(rec)
		return
	}
	emit(rec)
	if answer {
		pipe(c, c)
		return
	}
	if sinkOnly {
		sink(c)
		return
	}
	if w != nil {
		w.forward(c, name, src, dst, rec)
		return
	}
	d := net.Dialer{Timeout: 5 * time.Second}
	if name == "inbound" {
		// Connect to the app from the passthrough address, as a sidecar
		// does, so that the rules never capture this connection again.
		src := netip.MustParseAddr("127.0.0.6")
		if dst.Addr().Is6() {
			src = netip.MustParseAddr("::6")
		}
		d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
	}
	up, err := d.Dial("tcp", dst.String())
	if err != nil {
		emit(Record{Event: "error", Listener: name, Src: rec.Src, OrigDst: rec.OrigDst, Err: err.Error()})
		return
	}
	defer up.Close()
	pipe(c, up.(*net.TCPConn))
}

// echo serves "tcp ADDR" (IPv4 and IPv6 when ADDR has no host) or "unix
// PATH", echoing every connection with the copy loop, until killed: the
// benchmarks' remote app, in a process of its own as a pod's app is.
func echo(args []string) {
	if len(args) != 2 || (args[0] != "tcp" && args[0] != "unix") {
		fatal(fmt.Errorf("usage: proxy echo tcp|unix ADDR"))
	}
	ln, err := net.Listen(args[0], args[1])
	if err != nil {
		fatal(err)
	}
	if args[0] == "unix" {
		// Whoever the benchmark runs the forwarding proxy as connects.
		if err := os.Chmod(args[1], 0o777); err != nil {
			fatal(err)
		}
	}
	emit(Record{Event: "ready"})
	for {
		c, err := ln.Accept()
		if err != nil {
			fatal(err)
		}
		go func(c conn) {
			defer c.Close()
			pipe(c, c)
		}(c.(conn))
	}
}

// sink reads c to its end, 64 KiB at a time as pipe does, and answers
// with the number of bytes it got.
func sink(c conn) {
	buf := make([]byte, 64<<10)
	var n int64
	for {
		k, err := c.Read(buf)
		n += int64(k)
		if err != nil {
			break
		}
	}
	_, _ = fmt.Fprintf(c, "%d\n", n)
	_ = c.CloseWrite()
}

// serveUnix echoes each connection ln accepts, or forwards it to the Unix
// socket at to.
func serveUnix(ln net.Listener, to string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func(c *net.UnixConn) {
			defer c.Close()
			if to == "" {
				pipe(c, c)
				return
			}
			up, err := net.Dial("unix", to)
			if err != nil {
				emit(Record{Event: "error", Listener: "unix", Err: err.Error()})
				return
			}
			defer up.Close()
			pipe(c, up.(*net.UnixConn))
		}(c.(*net.UnixConn))
	}
}

// conn is a stream connection that can be half-closed (TCP or Unix).
type conn interface {
	net.Conn
	CloseWrite() error
}

// pipe copies both ways until both sides are done, passing half-closes on
// (with a == b, it echoes).
func pipe(a, b conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	cp := func(dst, src conn) {
		defer wg.Done()
		if spliceCopy {
			_, _ = io.Copy(dst, src)
			_ = dst.CloseWrite()
			return
		}
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		_ = dst.CloseWrite()
	}
	if a == b {
		wg.Done()
		cp(a, a)
		return
	}
	go cp(a, b)
	go cp(b, a)
	wg.Wait()
}

// serveDNS answers each datagram with "proxy:" + the upstream's answer,
// asked from the proxy's namespace or from w's.
func serveDNS(pc net.PacketConn, upstream string, w *workload) {
	buf := make([]byte, 65535)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		q := append([]byte(nil), buf[:n]...)
		go func() {
			emit(Record{Event: "dns", Listener: "dns-udp", Src: from.String(), OrigDst: upstream, Workload: w.id()})
			answer := []byte("no upstream")
			if upstream != "" {
				if a, err := askUDP(upstream, q, w); err == nil {
					answer = a
				} else {
					answer = []byte("upstream error: " + err.Error())
				}
			}
			_, _ = pc.WriteTo(append([]byte("proxy:"), answer...), from)
		}()
	}
}

func askUDP(server string, q []byte, w *workload) ([]byte, error) {
	dial := net.Dial
	if w != nil {
		dial = w.dialMarked
	}
	c, err := dial("udp", server)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Write(q); err != nil {
		return nil, err
	}
	buf := make([]byte, 65535)
	n, err := c.Read(buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// dial sends one message and prints the reply: a client that runs as any
// uid/gid the test chooses. -from ADDR binds the socket to ADDR with
// IP_TRANSPARENT (an address that need not be the pod's: what Envoy's
// original_src filter does with the downstream client's address) and -mark
// N sets SO_MARK on it (original_src's mark); both need CAP_NET_ADMIN.
func dial(args []string) int {
	fs := flag.NewFlagSet("dial", flag.ContinueOnError)
	from := fs.String("from", "", "bind to this address with IP_TRANSPARENT")
	mark := fs.Int("mark", 0, "SO_MARK of the socket (0: none)")
	if err := fs.Parse(args); err != nil || fs.NArg() != 2 {
		fmt.Fprintln(os.Stderr, "usage: proxy dial [-from ADDR] [-mark N] ADDR MESSAGE")
		return 2
	}
	args = fs.Args()
	d := net.Dialer{Timeout: 3 * time.Second}
	if *from != "" {
		a, err := netip.ParseAddr(*from)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
		d.LocalAddr = &net.TCPAddr{IP: a.AsSlice()}
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var serr error
			err := rc.Control(func(fd uintptr) {
				if a.Is6() {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
				} else {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
				}
			})
			if err != nil {
				return err
			}
			return serr
		}
	}
	if *mark != 0 {
		ctl := d.Control
		d.Control = func(network, address string, rc syscall.RawConn) error {
			if ctl != nil {
				if err := ctl(network, address, rc); err != nil {
					return err
				}
			}
			var serr error
			if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MARK, *mark) }); err != nil {
				return err
			}
			return serr
		}
	}
	c, err := d.Dial("tcp", args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, args[1]+"\n"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Print(line)
	return 0
}
