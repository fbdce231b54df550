//go:build kernel

package bench

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// The Unix-socket reference: the round trips BenchmarkFastpath and
// BenchmarkCapture time through the sidecar, made by the same processes
// with the same copy loops over Unix stream sockets instead of TCP. No
// TCP/IP, no netfilter and no BPF is on the way, only the kernel's local
// IPC: each process's system calls, copies and wake-ups, which every
// hand-off between two processes pays, the sockmap fast path's included (it
// takes TCP/IP and netfilter off a hop, not a process or a wake-up). Where
// this reference is no faster than REDIRECT, the round trip is made of the
// processes' wake-ups, not of the stack the fast path skips.

// unixRefDir is a directory for the Unix sockets that the test proxy, which
// runs as the proxy's uid, can create sockets in (b.TempDir's parent is
// private to root).
func unixRefDir(b *testing.B) string {
	dir, err := os.MkdirTemp("", "meshwire-unixref-")
	if err == nil {
		err = os.Chmod(dir, 0o777)
	}
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// unixRefHop times 64 B round trips between the benchmark's process and the
// test proxy in the pod echoing (-answer) on a Unix socket: the hop's two
// processes and echo loop.
func unixRefHop(b *testing.B, e *ie.Env, warm, n int, s *harness.Samples) {
	sock := filepath.Join(unixRefDir(b), "hop.sock")
	p := e.StartProxyIn(e.Pod, ie.ProxyUID, ie.ProxyUID, false, "-answer", "-unix", sock)
	defer p.Stop()
	waitSettled(b, "the Unix-socket reference, hop")
	unixRefRoundTrips(b, sock, warm, n, s)
}

// unixRefChain times 64 B round trips app -> sidecar -> sidecar -> app over
// Unix sockets: the benchmark's process to the pod's test proxy, which
// forwards to the remote's test proxy, which forwards to the remote app's
// echo process (as startRemoteEcho's, over a Unix socket).
func unixRefChain(b *testing.B, e *ie.Env, warm, n int, s *harness.Samples) {
	dir := unixRefDir(b)
	app, remote, pod := filepath.Join(dir, "app.sock"), filepath.Join(dir, "remote.sock"), filepath.Join(dir, "pod.sock")
	defer e.StartEcho(e.Remote, ie.OtherUID, ie.OtherUID, "unix", app).Stop()
	defer e.StartProxyIn(e.Remote, ie.ProxyUID, ie.ProxyUID, false, "-unix", remote, "-unix-to", app).Stop()
	defer e.StartProxyIn(e.Pod, ie.ProxyUID, ie.ProxyUID, false, "-unix", pod, "-unix-to", remote).Stop()
	waitSettled(b, "the Unix-socket reference, sidecar to sidecar")
	unixRefRoundTrips(b, pod, warm, n, s)
}

func unixRefRoundTrips(b *testing.B, sock string, warm, n int, s *harness.Samples) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	pingPong64(b, c, sock, warm, n, s)
}

// unixRefFigure states the Unix-socket reference ref beside redir, the
// rules alone.
func unixRefFigure(ref, redir time.Duration) string {
	return fmt.Sprintf("the same processes over Unix sockets: %s µs, %s of REDIRECT", fastpathBenchUs(ref), harness.Ratio(ref, redir))
}
