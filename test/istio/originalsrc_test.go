//go:build kernel

package istio

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// originalSrcMark is the mark Istio's sidecar puts on the upstream sockets
// of its original_src listener filter (pilot's xdsfilters.OriginalSrc,
// added to the inbound listener in TPROXY mode): the TPROXY mark, 1337.
const originalSrcMark = 1337

// TestOriginalSrcUnderTPROXY shows where the SYN of a sidecar's upstream
// connection to the app lands when, as Envoy's original_src filter does
// in TPROXY mode, the sidecar (uid 1337) binds it with IP_TRANSPARENT to
// the downstream client's address and connects to the app's pod address:
// with and without Istio's mark (1337), under Istio's own TPROXY rules
// (istio-iptables' inbound-ports-wildcard-tproxy golden, istio-nftables'
// for native nftables, with the policy routing istio-iptables adds
// beside them) and under iptables-init's -m TPROXY -b '*', on each
// backend. The outcome is the same for both rule sets: a property of
// Istio's rules (docs/reference-differences.md).
func TestOriginalSrcUnderTPROXY(t *testing.T) {
	harness.New(t)
	const golden = "inbound-ports-wildcard-tproxy"
	// What is measured, with and without the mark: nat's ISTIO_OUTPUT
	// (the proxy's uid, out on lo, to ISTIO_IN_REDIRECT) redirects the SYN
	// to 127.0.0.1:15006, matching the uid, not the mark (mangle's RETURN
	// for mark 1337 ends mangle's OUTPUT only); the listener then
	// cannot route its SYN-ACK from 127.0.0.1 to the client's address (Ip
	// OutNoRoutes), so the connection reaches neither the proxy nor the
	// app and the connect times out.
	want := "no answer, redirected to 127.0.0.1:15006, its SYN-ACKs unroutable"
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			outcome := map[string]map[int]string{}
			for _, rules := range []string{"istio", "meshwire"} {
				outcome[rules] = map[int]string{}
				t.Run(rules, func(t *testing.T) {
					h := harness.New(t)
					e := ie.New(t, h)
					if rules == "istio" {
						loadIstioTPROXY(t, e, b, golden)
					} else {
						flags := []string{"-u", "1337", "-g", "1337", "-m", "TPROXY", "-b", "*"}
						if b.variant == "" {
							flags = append(flags, "--native-nftables")
						} else {
							flags = append(flags, "--iptables-backend", b.name)
						}
						e.MustIptablesInit(flags...)
					}
					// The inbound listener answers itself (-answer): a
					// connection captured back to it is not forwarded
					// again, so nothing loops.
					p := e.StartProxy(true, "-answer")
					pod, client := ie.PodV4, ie.RemoteV4
					// The client's own connection is captured to 15006
					// and answered there.
					if got, err := ie.Request(e.Remote, ie.AP(pod, ie.AppPort), "in"); err != nil || got != "in" {
						t.Fatalf("the client's connection: %q, %v; want the proxy's answer", got, err)
					}
					for _, mark := range []int{0, originalSrcMark} {
						m := p.Mark()
						before := flowsTo(t, e, client, ie.AP(pod, ie.AppPort))
						noRoutes := outNoRoutes(t, e)
						got, err := e.DialFrom(ie.ProxyUID, ie.ProxyUID, client, mark, ie.AP(pod, ie.AppPort), "osrc")
						var where string
						switch {
						case err != nil:
							t.Logf("mark %d: %s", mark, strings.TrimSpace(err.Error()))
							where = "no answer"
						case strings.HasPrefix(got, "app "+client.String()+" "):
							where = "app"
						case got == "osrc":
							where = "15006"
							found := false
							for _, r := range p.Since(m) {
								if src, err := netip.ParseAddrPort(r.Src); err == nil && r.Listener == "inbound" && src.Addr() == client {
									found = true
								}
							}
							if !found {
								t.Errorf("mark %d: answered as by the proxy, but the proxy logged no inbound connection from %s", mark, client)
							}
						default:
							where = "unexpected reply " + got
						}
						// Where conntrack says the SYN went: a NATed
						// connection's reply comes from its new
						// destination.
						for k, reply := range flowsTo(t, e, client, ie.AP(pod, ie.AppPort)) {
							if _, ok := before[k]; !ok {
								where += ", redirected to " + reply
							}
						}
						if n := outNoRoutes(t, e) - noRoutes; n > 0 {
							where += ", its SYN-ACKs unroutable"
						}
						outcome[rules][mark] = where
						t.Logf("%s rules, %s, mark %d: the connection from %s to %s: %s", rules, b.name, mark, client, ie.AP(pod, ie.AppPort), where)
						if where != want {
							t.Errorf("%s rules, mark %d: %s; want %s", rules, mark, where, want)
						}
					}
					if t.Failed() {
						t.Log(ruleCounters(t, e, b))
					}
				})
			}
			for _, mark := range []int{0, originalSrcMark} {
				if outcome["istio"][mark] != outcome["meshwire"][mark] {
					t.Errorf("mark %d: Istio's rules: %s; meshwire's: %s", mark, outcome["istio"][mark], outcome["meshwire"][mark])
				}
			}
		})
	}
}

// loadIstioTPROXY loads Istio's golden TPROXY rules into the pod, and the
// policy routing istio-iptables adds beside them (not in its goldens):
// fwmark 1337 lookup 133, local default dev lo table 133.
func loadIstioTPROXY(t *testing.T, e *ie.Env, b backend, name string) {
	t.Helper()
	run := func(stdin string, args ...string) {
		t.Helper()
		cmd := exec.Command(args[0], args[1:]...)
		cmd.Stdin = strings.NewReader(stdin)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := e.Pod.Do(cmd.Run); err != nil {
			t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out.String())
		}
	}
	if b.variant == "" {
		g, err := File("tools/istio-nftables/pkg/capture/testdata/" + name + ".golden")
		if err != nil {
			t.Fatal(err)
		}
		run(string(g), "nft", "-f", "-")
	} else {
		g, err := File("tools/istio-iptables/pkg/capture/testdata/" + name + ".golden")
		if err != nil {
			t.Fatal(err)
		}
		v4, _ := SplitIPTablesGolden(string(g))
		run(v4, b.tool(false, "restore"), "--noflush")
	}
	run("", "ip", "-4", "rule", "add", "fwmark", "1337", "lookup", "133")
	run("", "ip", "-4", "route", "add", "local", "default", "dev", "lo", "table", "133")
}

// flowsTo returns the pod's conntrack entries from client to dst: the
// original source port, and the reply's source.
func flowsTo(t *testing.T, e *ie.Env, client netip.Addr, dst netip.AddrPort) map[uint16]string {
	t.Helper()
	// From a thread in the pod: a handle opened at a namespace dumps
	// conntrack from the caller's own.
	var flows []*netlink.ConntrackFlow
	if err := e.Pod.Do(func() (err error) {
		flows, err = netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		return err
	}); err != nil {
		t.Fatalf("conntrack: %v", err)
	}
	out := map[uint16]string{}
	for _, f := range flows {
		src, _ := netip.AddrFromSlice(f.Forward.SrcIP)
		d, _ := netip.AddrFromSlice(f.Forward.DstIP)
		if f.Forward.Protocol != unix.IPPROTO_TCP || src.Unmap() != client || netip.AddrPortFrom(d.Unmap(), f.Forward.DstPort) != dst {
			continue
		}
		r, _ := netip.AddrFromSlice(f.Reverse.SrcIP)
		out[f.Forward.SrcPort] = netip.AddrPortFrom(r.Unmap(), f.Reverse.SrcPort).String()
	}
	return out
}

// outNoRoutes is the pod's Ip OutNoRoutes counter (/proc/net/snmp).
func outNoRoutes(t *testing.T, e *ie.Env) int {
	t.Helper()
	var data []byte
	if err := e.Pod.Do(func() (err error) {
		data, err = os.ReadFile("/proc/thread-self/net/snmp")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	for i := 0; i+1 < len(lines); i++ {
		names, values := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(names) == 0 || names[0] != "Ip:" || len(values) != len(names) || values[0] != "Ip:" {
			continue
		}
		for j, n := range names {
			if n == "OutNoRoutes" {
				v, err := strconv.Atoi(values[j])
				if err != nil {
					t.Fatal(err)
				}
				return v
			}
		}
	}
	t.Fatalf("no Ip OutNoRoutes in /proc/net/snmp:\n%s", data)
	return 0
}

// ruleCounters prints the pod's rules with their counters.
func ruleCounters(t *testing.T, e *ie.Env, b backend) string {
	var out strings.Builder
	args := []string{"nft", "list", "ruleset"}
	if b.variant != "" {
		args = []string{b.tool(false, "save"), "-c"}
	}
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdout, cmd.Stderr = &out, &out
	_ = e.Pod.Do(cmd.Run)
	return fmt.Sprintf("%s:\n%s", strings.Join(args, " "), out.String())
}
