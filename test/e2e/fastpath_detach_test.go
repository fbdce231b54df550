//go:build kernel

package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/internal/probe"
	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// TestFastpathDetachKeepsQueuedBytes: two connections each have 256 KiB
// the fast path queued into the application's socket, unread, when the
// fast path is detached. Nothing of meshwire stays behind (no process, no
// pin), yet both connections' bytes are read intact afterwards, and the
// sockhash lives exactly as long as they do: each socket's psock holds the
// sk_msg program, which holds the sockhash. An earlier meshwire kept it
// with a holder process, which the DaemonSet's container end killed; this
// test, run with that holder killed by SIGKILL, is how the holder was
// found unneeded.
func TestFastpathDetachKeepsQueuedBytes(t *testing.T) {
	h := harness.New(t)
	fastpathAttach(t, h)
	e := redirectedPod(t, h)
	const (
		port = 9098
		size = 256 << 10
	)
	// The remote sends each connection size bytes of a pattern naming the
	// connection, then waits for the app to close.
	ln, err := probe.InNS(e.Remote.Path, func() (net.Listener, error) { return net.Listen("tcp", ":"+strconv.Itoa(port)) })
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	payload := func(i int) []byte { return bytes.Repeat([]byte(fmt.Sprintf("conn%d;", i)), size/6+1)[:size] }
	go func() {
		for i := 0; ; i++ {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn, i int) {
				defer c.Close()
				_, _ = c.Write(payload(i))
				_, _ = io.Copy(io.Discard, c)
			}(c, i)
		}
	}()
	before := fastpathStatus(t, h)
	var conns []*net.TCPConn
	for range 2 {
		c, err := ie.Dial(e.Pod, ie.AP(ie.RemoteV4, port))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		conns = append(conns, c)
		// One connection at a time, so that the remote numbers them in
		// this order.
		want := before.RedirectedBytes + uint64(len(conns)*size)
		waitUntil(t, 10*time.Second, "the bytes queued on the fast path", func() bool { return fastpathStatus(t, h).RedirectedBytes >= want })
	}

	out := fastpathDetach(t, h)
	// Each connection has two sockets on the fast path: the app's and the
	// proxy's end toward it.
	if !strings.Contains(out, "4 sockets keep it until they close") {
		t.Fatalf("detach with two sockets on the fast path: %s", out)
	}
	if _, err := os.Stat(fastpath.DefaultPinDir); !os.IsNotExist(err) {
		t.Fatalf("pins left after detach: %v", err)
	}
	if n := liveSockhashes(t); n != 1 {
		t.Fatalf("%d sockhashes in the kernel after detach, want the one its sockets keep", n)
	}
	for i, c := range conns {
		got := make([]byte, size)
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := io.ReadFull(c, got); err != nil {
			t.Fatalf("connection %d: read %d of the %d bytes queued before detach: %v", i, n, size, err)
		}
		if !bytes.Equal(got, payload(i)) {
			t.Fatalf("connection %d: the %d bytes read differ from those sent", i, size)
		}
	}
	for _, c := range conns {
		c.Close()
	}
	waitSockhashFreed(t)
}

// waitSockhashFreed waits until the kernel has freed every fast-path
// sockhash: after detach, once the last socket on it has closed.
func waitSockhashFreed(t *testing.T) {
	t.Helper()
	waitUntil(t, 5*time.Second, "the sockhash freed once its sockets closed", func() bool { return liveSockhashes(t) == 0 })
}

// liveSockhashes counts the kernel's fast-path sockhashes.
func liveSockhashes(t *testing.T) int {
	t.Helper()
	n, err := fastpath.Sockhashes()
	if err != nil {
		t.Fatal(err)
	}
	return n
}
