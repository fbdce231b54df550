// Package probe opens sockets inside a network namespace to check
// reachability from there: ICMP echo (Ping, without depending on the ping
// binary being installed), and TCP or UDP listeners and connections (Listen,
// Dial, or any socket through InNS). Importing it settles, in the host's
// namespace, Go's once-per-process probe of the IP stack (see
// PrimeIPStack).
package probe

import (
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// InNS opens a socket-owning resource inside the namespace at nsPath (the
// caller's own namespace when nsPath is empty). A socket belongs to the
// namespace it was created in, so the caller can use it from any goroutine
// afterwards.
func InNS[T any](nsPath string, open func() (T, error)) (T, error) {
	var v T
	if nsPath == "" {
		return open()
	}
	netNS, err := ns.GetNS(nsPath)
	if err != nil {
		return v, err
	}
	defer netNS.Close()
	err = netNS.Do(func(ns.NetNS) error {
		var err error
		v, err = open()
		return err
	})
	return v, err
}

// Ping sends ICMP (or ICMPv6) echo requests to dst from inside the
// namespace at nsPath, one every pingResend until a reply arrives or
// timeout passes, and returns the round-trip time of the request answered.
// One request alone can be lost while the path settles: an IPv6 neighbour
// still running duplicate address detection drops the first solicitation,
// and the kernel's next one comes a second later.
func Ping(nsPath string, dst net.IP, timeout time.Duration) (time.Duration, error) {
	network, listen, proto := "ip4:icmp", "0.0.0.0", 1
	var typ, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	if dst.To4() == nil {
		network, listen, proto = "ip6:ipv6-icmp", "::", 58
		typ, reply = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	}
	conn, err := InNS(nsPath, func() (*icmp.PacketConn, error) { return icmp.ListenPacket(network, listen) })
	if err != nil {
		return 0, fmt.Errorf("open ICMP socket in %s: %w", nsPath, err)
	}
	defer conn.Close()
	id := os.Getpid() & 0xffff
	var sent []time.Time // sent[i] is when sequence number i+1 left
	send := func() error {
		msg := icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: len(sent) + 1, Data: []byte("meshwire probe")}}
		b, err := msg.Marshal(nil)
		if err != nil {
			return err
		}
		sent = append(sent, time.Now())
		if _, err := conn.WriteTo(b, &net.IPAddr{IP: dst}); err != nil {
			return fmt.Errorf("ping %s: %w", dst, err)
		}
		return nil
	}
	deadline := time.Now().Add(timeout)
	buf := make([]byte, 1500)
	for {
		if err := send(); err != nil {
			return 0, err
		}
		wait := sent[len(sent)-1].Add(pingResend)
		if wait.After(deadline) {
			wait = deadline
		}
		_ = conn.SetReadDeadline(wait)
		for {
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				var ne net.Error
				if !errors.As(err, &ne) || !ne.Timeout() {
					return 0, fmt.Errorf("ping %s: %w", dst, err)
				}
				if !time.Now().Before(deadline) {
					return 0, fmt.Errorf("ping %s: no reply to %d requests within %s", dst, len(sent), timeout)
				}
				break // resend
			}
			m, err := icmp.ParseMessage(proto, buf[:n])
			if err != nil || m.Type != reply {
				continue
			}
			if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id && e.Seq >= 1 && e.Seq <= len(sent) {
				return time.Since(sent[e.Seq-1]), nil
			}
		}
	}
}

// pingResend is how long Ping waits for a reply before sending the next
// request.
const pingResend = 250 * time.Millisecond

// Listen opens a listener inside the namespace.
func Listen(nsPath, network, addr string) (net.Listener, error) {
	return InNS(nsPath, func() (net.Listener, error) { return net.Listen(network, addr) })
}

// Dial connects from inside the namespace.
func Dial(nsPath, network, addr string, timeout time.Duration) (net.Conn, error) {
	return InNS(nsPath, func() (net.Conn, error) { return net.DialTimeout(network, addr, timeout) })
}

// Go decides once per process whether the stack supports IPv6 and
// IPv4-mapped addresses, by opening probe sockets in whatever network
// namespace the first wildcard listen happens in. If that is a pod namespace
// whose lo is down (no ::1), the process concludes there is no IPv6, and
// every later listen on "tcp" ":port" is IPv4 only, in every namespace.
// Importing this package settles the question in the namespace the program
// starts in (the host's).
func init() { PrimeIPStack() }

// PrimeIPStack makes Go probe the IP stack's capabilities now, in the
// calling thread's namespace.
func PrimeIPStack() {
	if l, err := net.Listen("tcp", ":0"); err == nil {
		l.Close()
	}
}
