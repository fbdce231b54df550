//go:build kernel

package e2e

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
	"golang.org/x/sys/unix"
)

// TestFastpathStreams carries streams through an Istio-style pod with both
// directions on the fast path (the pod's policy feeds its proxy) and
// checks every byte: several MiB full duplex and pipelined, a half-close
// with the whole upload echoed back after it, and a response followed by
// a reset. Each subtest also checks that the fast path carried its bytes,
// so that a pass on TCP alone does not count.
func TestFastpathStreams(t *testing.T) {
	h := harness.New(t)
	fastpathAttach(t, h)
	e := redirectedPod(t, h)
	if err := netns.Enter(e.Pod.Path, func() error {
		_, err := podpolicy.Set("", podpolicy.Policy{IntoProxy: true})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	const (
		echoAllPort  = 9095 // echoes every byte, closes its side after the client's FIN
		resetterPort = 9096 // answers one request line with 1 MiB, then resets
		response     = 1 << 20
	)
	e.Serve(e.Remote, echoAllPort, func(c net.Conn) {
		defer c.Close()
		if _, err := io.Copy(c, c); err == nil {
			_ = c.(*net.TCPConn).CloseWrite()
		}
	})
	body := make([]byte, response)
	_, _ = rand.Read(body)
	e.Serve(e.Remote, resetterPort, func(c net.Conn) {
		defer c.Close()
		if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
			return
		}
		if _, err := c.Write(body); err != nil {
			return
		}
		// A reset discards what the remote has not sent yet; wait until
		// the proxy's socket has acknowledged the whole response, so the
		// reset tests what happens to bytes already past the remote.
		if err := waitSent(c.(*net.TCPConn), 10*time.Second); err != nil {
			return
		}
		_ = c.(*net.TCPConn).SetLinger(0) // close sends RST
	})
	carried := func(t *testing.T, before uint64, atLeast int) {
		t.Helper()
		if d := fastpathStatus(t, h).RedirectedBytes - before; d < uint64(atLeast) {
			t.Fatalf("the fast path carried %d bytes, want at least %d", d, atLeast)
		}
	}

	t.Run("full duplex", func(t *testing.T) {
		const lines, size = 128, 64 << 10 // 8 MiB each way
		before := fastpathStatus(t, h).RedirectedBytes
		c, err := ie.Dial(e.Pod, ie.AP(ie.RemoteV4, ie.RemotePort))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		payloads := make([][]byte, lines)
		for i := range payloads {
			payloads[i] = randomLine(size)
		}
		wrote := make(chan error, 1)
		go func() {
			for _, p := range payloads {
				if _, err := c.Write(append(append([]byte(nil), p...), '\n')); err != nil {
					wrote <- err
					return
				}
			}
			wrote <- nil
		}()
		r := bufio.NewReaderSize(c, 128<<10)
		prefix := []byte("remote " + ie.PodV4.String() + " ")
		for i, p := range payloads {
			line, err := r.ReadBytes('\n')
			if err != nil {
				t.Fatalf("line %d of %d: %v", i, lines, err)
			}
			if want := append(append([]byte(nil), prefix...), p...); !bytes.Equal(line[:len(line)-1], want) {
				t.Fatalf("line %d of %d differs from the one sent", i, lines)
			}
		}
		if err := <-wrote; err != nil {
			t.Fatal(err)
		}
		carried(t, before, 2*lines*size)
	})

	t.Run("half close", func(t *testing.T) {
		const size = 4 << 20
		before := fastpathStatus(t, h).RedirectedBytes
		c, err := ie.Dial(e.Pod, ie.AP(ie.RemoteV4, echoAllPort))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		up := randomLine(size)
		wrote := make(chan error, 1)
		go func() {
			_, err := c.Write(up)
			if err == nil {
				err = c.CloseWrite()
			}
			wrote <- err
		}()
		down, err := io.ReadAll(c)
		if err != nil {
			t.Fatalf("read the echo to its end: %v (%d bytes)", err, len(down))
		}
		if err := <-wrote; err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(down, up) {
			t.Fatalf("echo of %d bytes after the half-close differs from the %d sent", len(down), len(up))
		}
		carried(t, before, 2*size)
	})

	t.Run("reset after response", func(t *testing.T) {
		before := fastpathStatus(t, h).RedirectedBytes
		c, err := ie.Dial(e.Pod, ie.AP(ie.RemoteV4, resetterPort))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write([]byte("GET\n")); err != nil {
			t.Fatal(err)
		}
		// Let the reset arrive before the application reads anything.
		time.Sleep(200 * time.Millisecond)
		got, err := io.ReadAll(c)
		if !bytes.Equal(got, body) {
			t.Fatalf("read %d bytes of the %d-byte response before the end (%v)", len(got), len(body), err)
		}
		if err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("after the response: %v, want EOF or a reset", err)
		}
		carried(t, before, response)
		t.Logf("after the response: %v", err)
	})
}

// waitSent waits until the peer has acknowledged every byte written to c
// (SIOCOUTQ, the unacknowledged bytes in its send queue, is zero).
func waitSent(c *net.TCPConn, limit time.Duration) error {
	raw, err := c.SyscallConn()
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(limit); ; {
		var queued int
		var ioErr error
		if err := raw.Control(func(fd uintptr) {
			queued, ioErr = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ)
		}); err != nil {
			return err
		}
		if ioErr != nil {
			return ioErr
		}
		if queued == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d bytes still unacknowledged after %v", queued, limit)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
