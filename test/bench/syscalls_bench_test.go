//go:build kernel

package bench

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// Where a hop's round trip goes: BenchmarkFastpath times 64 B round trips
// on a connection whose app side makes its own system calls, timing its
// write(2) and the read(2) that returned the reply (not the ones that
// found nothing and parked the goroutine). What a message costs the kernel
// on its way from socket to socket (TCP/IP and netfilter, or the fast
// path's hand-off, and the receiver's wake-up) is inside these calls; the
// rest of a round trip is each process waking up, being scheduled and
// running its own code. The proxy's calls are not timed: its echo makes
// the same two calls on the same kind of message, so a round trip holds
// about twice the app's. A hand-off that cost nothing would still leave
// the rest, and each call's own cost (about what a read(2) of bytes already
// queued takes).

// sysSplit is one configuration's hop, split.
type sysSplit struct {
	rtt  harness.Samples // the round trip
	w, r harness.Samples // the app's write(2), and its read(2) of the reply
	rest harness.Samples // rtt - 2 * (w + r)
}

// fastpathBenchSyscalls runs warm+n 64 B round trips from the pod to dst,
// recording the last n into s.
func fastpathBenchSyscalls(b *testing.B, e *ie.Env, dst netip.AddrPort, warm, n int, s *sysSplit) {
	c, err := ie.Dial(e.Pod, dst)
	if err != nil {
		b.Fatalf("dial %s: %v", dst, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
	rc, err := c.SyscallConn()
	if err != nil {
		b.Fatal(err)
	}
	msg := fastpathBenchMsg(64)
	buf := make([]byte, 4<<10)
	for i := 0; i < warm+n; i++ {
		start := time.Now()
		w, r, got, err := sysRoundTrip(rc, msg, buf)
		rtt := time.Since(start)
		if err == nil && (got < len(msg) || string(buf[got-len(msg):got]) != string(msg)) {
			err = fmt.Errorf("a reply of %d bytes that does not end with the %d-byte request", got, len(msg))
		}
		if err != nil {
			b.Fatalf("round trip %d to %s: %v", i, dst, err)
		}
		if i >= warm {
			s.rtt = append(s.rtt, rtt)
			s.w = append(s.w, w)
			s.r = append(s.r, r)
			s.rest = append(s.rest, rtt-2*(w+r))
		}
	}
}

// sysRoundTrip writes msg and reads until a newline ends the reply in buf,
// returning how long the write(2) and the successful read(2) calls took
// and how many bytes it read.
func sysRoundTrip(rc syscall.RawConn, msg, buf []byte) (w, r time.Duration, got int, err error) {
	sent := 0
	werr := rc.Write(func(fd uintptr) bool {
		t := time.Now()
		k, e := unix.Write(int(fd), msg[sent:])
		if errors.Is(e, unix.EAGAIN) {
			return false
		}
		w += time.Since(t)
		if e != nil {
			err = e
			return true
		}
		sent += k
		return sent == len(msg)
	})
	if err == nil {
		err = werr
	}
	for err == nil && (got == 0 || buf[got-1] != '\n') {
		if got == len(buf) {
			return w, r, got, fmt.Errorf("a reply longer than %d bytes", len(buf))
		}
		rerr := rc.Read(func(fd uintptr) bool {
			t := time.Now()
			k, e := unix.Read(int(fd), buf[got:])
			if errors.Is(e, unix.EAGAIN) {
				return false
			}
			r += time.Since(t)
			switch {
			case e != nil:
				err = e
			case k == 0:
				err = net.ErrClosed
			default:
				got += k
			}
			return true
		})
		if err == nil {
			err = rerr
		}
	}
	return w, r, got, err
}
