package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// fastpathCmd runs the built `meshwire fastpath ARGS` and returns its exit
// code and output.
func fastpathCmd(t *testing.T, h *harness.H, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(h.BinDir, "meshwire"), append([]string{"fastpath"}, args...)...)
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), string(out)
	}
	if err != nil {
		t.Fatalf("run meshwire fastpath: %v", err)
	}
	return 0, string(out)
}

// fastpathAttach attaches the fast path for the test and detaches it at
// cleanup (also when the test fails).
func fastpathAttach(t *testing.T, h *harness.H, args ...string) {
	t.Helper()
	if code, out := fastpathCmd(t, h, append([]string{"attach"}, args...)...); code != 0 {
		t.Fatalf("fastpath attach: exit %d: %s", code, out)
	}
	t.Cleanup(func() { fastpathCmd(t, h, "detach") })
}

func fastpathStatus(t *testing.T, h *harness.H) fastpath.Status {
	t.Helper()
	code, out := fastpathCmd(t, h, "status", "--json")
	if code != 0 {
		t.Fatalf("fastpath status: exit %d: %s", code, out)
	}
	var st fastpath.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("fastpath status --json: %v: %s", err, out)
	}
	return st
}

// pingPong sends rounds lines of payload on one connection to an echo server
// ("WHO PEER MSG" answers) and checks each answer byte for byte.
func pingPong(t *testing.T, c net.Conn, rounds int, payload []byte, wantPrefix string) {
	t.Helper()
	r := bufio.NewReaderSize(c, 64<<10)
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	for i := range rounds {
		if _, err := c.Write(append(append([]byte(nil), payload...), '\n')); err != nil {
			t.Fatalf("round %d: write: %v", i, err)
		}
		line, err := r.ReadBytes('\n')
		if err != nil {
			t.Fatalf("round %d: read: %v", i, err)
		}
		want := append([]byte(wantPrefix), payload...)
		if !bytes.Equal(line[:len(line)-1], want) {
			t.Fatalf("round %d: reply of %d bytes differs from the %d expected (first 60: %q)", i, len(line)-1, len(want), line[:min(60, len(line))])
		}
	}
}

func randomLine(n int) []byte {
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = letters[rand.IntN(len(letters))]
	}
	return b
}

func TestFastpathTraffic(t *testing.T) {
	for _, mode := range []string{"REDIRECT", "TPROXY"} {
		t.Run(mode, func(t *testing.T) {
			h := harness.New(t)
			fastpathAttach(t, h, "--into-proxy")
			e := ie.New(t, h)
			e.StartProxy(mode == "TPROXY")
			e.MustIptablesInit("-m", mode, "-i", "*", "-b", "*")
			for _, fam := range interceptFamilies {
				t.Run(fam.name, func(t *testing.T) {
					pod, remote := ie.Pod(fam.v6), ie.Remote(fam.v6)
					before := fastpathStatus(t, h)
					c, err := ie.Dial(e.Pod, ie.AP(remote, ie.RemotePort))
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					for _, n := range []int{1, 64, 4096, 100 << 10, 4 << 20} {
						pingPong(t, c, 3, randomLine(n), "remote "+pod.String()+" ")
					}
					mid := fastpathStatus(t, h)
					t.Logf("outbound: %+v", mid.Counters)
					in, err := ie.Dial(e.Remote, ie.AP(pod, ie.AppPort))
					if err != nil {
						t.Fatal(err)
					}
					defer in.Close()
					for _, n := range []int{1, 64, 4096, 100 << 10, 4 << 20} {
						pingPong(t, in, 3, randomLine(n), "app "+interceptPassthrough(fam.v6)+" ")
					}
					after := fastpathStatus(t, h)
					t.Logf("inbound: %+v", after.Counters)
					_ = before
					_ = io.EOF
					_ = netip.Addr{}
					_ = strings.TrimSpace
					_ = fmt.Sprint
				})
			}
		})
	}
}
