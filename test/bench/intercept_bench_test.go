//go:build kernel

package bench

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// interceptBenchFlags is the command line Istio's injector gives its init
// container: the default rule set of a mesh pod.
var interceptBenchFlags = []string{"-p", "15001", "-z", "15006", "-u", "1337", "-m", "REDIRECT", "-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020"}

const (
	interceptBenchApplies  = 20        // installs timed per backend
	interceptBenchRequests = 2000      // ping-pongs on one connection
	interceptBenchConnects = 200       // new connection + one request
	interceptBenchBytes    = 256 << 20 // bytes pushed per throughput run
)

// BenchmarkIntercept measures iptables-init and the path through the test
// proxy:
//   - the time to apply istio's default rule set, fresh and re-run (a no-op),
//     with each backend, next to the same rules applied one iptables exec per
//     rule (how shell-script installers did it);
//   - request round trip and throughput app -> proxy -> remote (outbound)
//     and remote -> proxy -> app (inbound) with no interception (the limit),
//     REDIRECT and TPROXY.
//
// There is no reference implementation of iptables-init in /usr/lib/cni;
// the ratios are against the per-rule installer and against no
// interception.
func BenchmarkIntercept(b *testing.B) {
	h := harness.New(b)
	for i := 0; i < b.N; i++ {
		interceptBenchApply(b, h)
		interceptBenchTraffic(b, h)
	}
}

func interceptBenchApply(b *testing.B, h *harness.H) {
	e := ie.New(b, h)
	base, withBase := baseline(b)
	tab := &harness.Table{
		Title:  fmt.Sprintf("iptables-init: time to apply istio's default rule set (IPv4 + IPv6, median / p95 of %d, ms)", interceptBenchApplies),
		Header: []string{"backend", "fresh install", "re-run (no-op)", "one iptables exec per rule", "fresh / per-rule"},
	}
	if withBase {
		tab.Header = append(tab.Header, "baseline fresh", "baseline re-run", "fresh / baseline")
	}
	mw := filepath.Join(h.BinDir, "iptables-init")
	for _, backend := range []string{"nft", "legacy", "nftables"} {
		args := append([]string{"--iptables-backend", backend}, interceptBenchFlags...)
		var fresh, rerun, perRule, baseFresh, baseRerun harness.Samples
		// install times a fresh install and a re-run of bin, and cleans up.
		install := func(bin string, fresh, rerun *harness.Samples) {
			if err := fresh.Time(func() error { return interceptBenchExec(e, bin, args...) }); err != nil {
				b.Fatal(err)
			}
			if err := rerun.Time(func() error { return interceptBenchExec(e, bin, args...) }); err != nil {
				b.Fatal(err)
			}
			if err := interceptBenchRun(e, "--cleanup-only"); err != nil {
				b.Fatal(err)
			}
		}
		// The per-rule installer re-creates what iptables-init installs.
		var payload map[string]string
		if backend != "nftables" {
			if err := interceptBenchRun(e, args...); err != nil {
				b.Fatal(err)
			}
			payload = interceptBenchPayload(b, e, backend)
			if err := interceptBenchRun(e, "--cleanup-only"); err != nil {
				b.Fatal(err)
			}
		}
		for i := 0; i < interceptBenchApplies; i++ {
			if withBase && i%2 == 1 {
				install(filepath.Join(base.dir, "iptables-init"), &baseFresh, &baseRerun)
			}
			install(mw, &fresh, &rerun)
			if withBase && i%2 == 0 {
				install(filepath.Join(base.dir, "iptables-init"), &baseFresh, &baseRerun)
			}
			if payload != nil {
				if err := perRule.Time(func() error { return interceptBenchPerRule(e, backend, payload) }); err != nil {
					b.Fatal(err)
				}
				if err := interceptBenchRun(e, "--cleanup-only"); err != nil {
					b.Fatal(err)
				}
			}
		}
		pr, ratio := "n/a", "n/a"
		if len(perRule) > 0 {
			pr = harness.Ms(perRule.Median()) + " / " + harness.Ms(perRule.P95())
			ratio = harness.Ratio(fresh.Median(), perRule.Median())
		}
		name := map[string]string{"nft": "iptables-nft", "legacy": "iptables-legacy", "nftables": "nftables (native)"}[backend]
		cells := []string{name, harness.Ms(fresh.Median()) + " / " + harness.Ms(fresh.P95()), harness.Ms(rerun.Median()) + " / " + harness.Ms(rerun.P95()), pr, ratio}
		if withBase {
			cells = append(cells, harness.Ms(baseFresh.Median())+" / "+harness.Ms(baseFresh.P95()),
				harness.Ms(baseRerun.Median())+" / "+harness.Ms(baseRerun.P95()), harness.Ratio(fresh.Median(), baseFresh.Median()))
		}
		tab.Add(cells...)
	}
	tab.Write(os.Stdout)
}

func interceptBenchRun(e *ie.Env, args ...string) error {
	return interceptBenchExec(e, filepath.Join(e.H.BinDir, "iptables-init"), args...)
}

// interceptBenchExec runs an iptables-init binary in the pod.
func interceptBenchExec(e *ie.Env, bin string, args ...string) error {
	var out []byte
	err := e.Pod.Do(func() (err error) {
		out, err = exec.Command(bin, args...).CombinedOutput()
		return err
	})
	if err != nil {
		return fmt.Errorf("%s %v: %v: %s", bin, args, err, out)
	}
	return nil
}

// interceptBenchPayload reads the installed rules back (both families) as
// iptables-save lines.
func interceptBenchPayload(b *testing.B, e *ie.Env, backend string) map[string]string {
	out := map[string]string{}
	for _, tool := range []string{"iptables", "ip6tables"} {
		s, err := e.Pod.Exec(tool + "-" + backend + "-save")
		if err != nil {
			b.Fatalf("%s-save: %v", tool, err)
		}
		out[tool] = s
	}
	return out
}

// interceptBenchPerRule re-creates the saved rules one iptables command at
// a time.
func interceptBenchPerRule(e *ie.Env, backend string, saves map[string]string) error {
	for tool, save := range saves {
		bin := tool + "-" + backend
		table := ""
		for _, line := range strings.Split(save, "\n") {
			var args []string
			switch {
			case strings.HasPrefix(line, "*"):
				table = line[1:]
				continue
			case strings.HasPrefix(line, ":ISTIO_"):
				args = []string{"-t", table, "-N", strings.Fields(line[1:])[0]}
			case strings.HasPrefix(line, "-A "):
				args = append([]string{"-t", table}, interceptBenchSplit(line)...)
			default:
				continue
			}
			cmd := exec.Command(bin, append([]string{"-w"}, args...)...)
			if err := e.Pod.Do(cmd.Run); err != nil {
				return fmt.Errorf("%s %v: %v", bin, args, err)
			}
		}
	}
	return nil
}

// interceptBenchSplit splits an iptables-save line, honouring the quotes
// around comments.
func interceptBenchSplit(line string) []string {
	var out []string
	for len(line) > 0 {
		line = strings.TrimLeft(line, " ")
		if line == "" {
			break
		}
		if line[0] == '"' {
			end := strings.IndexByte(line[1:], '"') + 1
			out = append(out, line[1:end])
			line = line[end+1:]
			continue
		}
		f, rest, _ := strings.Cut(line, " ")
		out = append(out, f)
		line = rest
	}
	return out
}

type interceptBenchPath struct {
	rtt, connect harness.Samples
	mbps         float64
}

func interceptBenchTraffic(b *testing.B, h *harness.H) {
	modes := []string{"none", "REDIRECT", "TPROXY"}
	res := map[string]map[string]*interceptBenchPath{}
	for _, mode := range modes {
		e := ie.New(b, h)
		if mode != "none" {
			e.StartProxy(mode == "TPROXY")
			if err := interceptBenchRun(e, "-m", mode, "-i", "*", "-b", "*"); err != nil {
				b.Fatal(err)
			}
		}
		res[mode] = map[string]*interceptBenchPath{
			"outbound": interceptBenchMeasure(b, e.Pod, ie.RemoteV4),
			"inbound":  interceptBenchMeasure(b, e.Remote, ie.PodV4),
		}
	}
	rt := &harness.Table{
		Title:  fmt.Sprintf("interception: request round trip, IPv4, 64-byte ping-pong on one connection (median / p95 of %d, µs) and new connection + request (median of %d, µs)", interceptBenchRequests, interceptBenchConnects),
		Header: []string{"path", "mode", "round trip", "vs none", "connect + request", "vs none"},
	}
	tp := &harness.Table{
		Title:  fmt.Sprintf("interception: throughput, IPv4, one connection, %d MiB (MB/s)", interceptBenchBytes>>20),
		Header: []string{"path", "mode", "throughput", "vs none"},
	}
	us := func(d time.Duration) string { return strconv.FormatInt(d.Microseconds(), 10) }
	for _, dir := range []string{"outbound", "inbound"} {
		base := res["none"][dir]
		for _, mode := range modes {
			r := res[mode][dir]
			path := "app -> proxy -> remote"
			if dir == "inbound" {
				path = "remote -> proxy -> app"
			}
			if mode == "none" {
				path = strings.ReplaceAll(path, " -> proxy", "")
			}
			rt.Add(path, mode, us(r.rtt.Median())+" / "+us(r.rtt.P95()), harness.Ratio(r.rtt.Median(), base.rtt.Median()),
				us(r.connect.Median()), harness.Ratio(r.connect.Median(), base.connect.Median()))
			tp.Add(path, mode, fmt.Sprintf("%.0f", r.mbps), fmt.Sprintf("%.2fx", r.mbps/base.mbps))
		}
	}
	rt.Write(os.Stdout)
	tp.Write(os.Stdout)
}

// interceptBenchMeasure runs the three measurements from ns to dst.
func interceptBenchMeasure(b *testing.B, from *harness.NS, dst netip.Addr) *interceptBenchPath {
	echoPort := ie.RemotePort
	if dst == ie.PodV4 {
		echoPort = ie.AppPort
	}
	p := &interceptBenchPath{}
	c, err := ie.Dial(from, ie.AP(dst, echoPort))
	if err != nil {
		b.Fatal(err)
	}
	r := bufio.NewReader(c)
	msg := strings.Repeat("x", 63) + "\n"
	for i := 0; i < interceptBenchRequests; i++ {
		if err := p.rtt.Time(func() error {
			if _, err := io.WriteString(c, msg); err != nil {
				return err
			}
			_, err := r.ReadString('\n')
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	c.Close()
	for i := 0; i < interceptBenchConnects; i++ {
		if err := p.connect.Time(func() error {
			_, err := ie.Request(from, ie.AP(dst, echoPort), "hi")
			return err
		}); err != nil {
			b.Fatal(err)
		}
	}
	sink, err := ie.Dial(from, ie.AP(dst, ie.SinkPort))
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close()
	buf := make([]byte, 256<<10)
	start := time.Now()
	for sent := 0; sent < interceptBenchBytes; sent += len(buf) {
		if _, err := sink.Write(buf); err != nil {
			b.Fatal(err)
		}
	}
	_ = sink.CloseWrite()
	line, err := bufio.NewReader(sink).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != strconv.Itoa(interceptBenchBytes) {
		b.Fatalf("sink got %q, %v", line, err)
	}
	p.mbps = float64(interceptBenchBytes) / 1e6 / time.Since(start).Seconds()
	return p
}
