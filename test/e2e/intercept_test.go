//go:build kernel

package e2e

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// interceptFamilies names the two address families the traffic tests cover.
var interceptFamilies = []struct {
	name string
	v6   bool
}{{"IPv4", false}, {"IPv6", true}}

// interceptPassthrough is the source the test proxy uses toward the app.
func interceptPassthrough(v6 bool) string {
	if v6 {
		return "::6"
	}
	return "127.0.0.6"
}

// interceptExpect makes one request and checks who answered, who the
// answering server saw as its peer, and which proxy records it left (none
// when listener is "").
func interceptExpect(t *testing.T, e *ie.Env, from *harness.NS, dst netip.AddrPort, wantWho, wantPeer, listener string) {
	t.Helper()
	mark := requestVia(t, e.Proxy, from, dst, wantWho, wantPeer)
	interceptCheckRecords(t, e, mark, dst, listener)
}

// requestVia makes one request from ns to dst, checks that the server's
// reply says who answered and saw which peer address, and returns the
// mark of proxy p's log before it, for the caller's check of what p saw.
func requestVia(t *testing.T, p *ie.Proxy, from *harness.NS, dst netip.AddrPort, wantWho, wantPeer string) int {
	t.Helper()
	mark := p.Mark()
	msg := fmt.Sprintf("m%d", mark)
	reply, err := ie.Request(from, dst, msg)
	if err != nil {
		t.Fatalf("request to %s from %s: %v", dst, from.Name, err)
	}
	if want := fmt.Sprintf("%s %s %s", wantWho, wantPeer, msg); reply != want {
		t.Fatalf("request to %s from %s: reply %q, want %q", dst, from.Name, reply, want)
	}
	return mark
}

func interceptCheckRecords(t *testing.T, e *ie.Env, mark int, dst netip.AddrPort, listener string) {
	t.Helper()
	recs := e.Proxy.Since(mark)
	if listener == "" {
		if len(recs) != 0 {
			t.Fatalf("connection to %s should bypass the proxy, but it saw %+v", dst, recs)
		}
		return
	}
	if len(recs) != 1 || recs[0].Listener != listener || recs[0].OrigDst != dst.String() || recs[0].Err != "" {
		t.Fatalf("connection to %s: proxy records %+v, want one on %s with original destination %s", dst, recs, listener, dst)
	}
}

// interceptTunnel checks a remote's connection to the pod's tunnel port
// (15008): left alone with REDIRECT, captured with TPROXY, as
// istio-iptables has it (its exclusion of the tunnel port is in the nat
// table only).
func interceptTunnel(t *testing.T, e *ie.Env, mode string, v6 bool) {
	t.Helper()
	pod, remote := ie.Pod(v6), ie.Remote(v6)
	if mode == "TPROXY" {
		interceptExpect(t, e, e.Remote, ie.AP(pod, ie.TunnelPort), "app", interceptPassthrough(v6), "inbound")
		return
	}
	interceptExpect(t, e, e.Remote, ie.AP(pod, ie.TunnelPort), "app", remote.String(), "")
}

// TestInterceptTraffic drives real connections through the rules
// iptables-init installs and the test proxy (uid 1337), for REDIRECT and
// TPROXY, IPv4 and IPv6; and the same connections through EBPF mode (no
// rule: the node's programs capture, with the test proxy reading
// SO_ORIGINAL_DST as with REDIRECT), where the settings it implements
// allow.
func TestInterceptTraffic(t *testing.T) {
	for _, mode := range []string{"REDIRECT", "TPROXY", "EBPF"} {
		t.Run(mode, func(t *testing.T) {
			h := harness.New(t)
			h.CheckNoLeaks()
			ebpf := mode == "EBPF"
			if ebpf {
				interceptEBPFAttach(t, h)
			}
			e := ie.New(t, h)
			e.StartProxy(mode == "TPROXY")
			run := func(args ...string) {
				t.Helper()
				e.MustIptablesInit(append([]string{"-m", mode, "--reconcile"}, args...)...)
			}

			t.Run("everything", func(t *testing.T) {
				run("-i", "*", "-b", "*")
				for _, fam := range interceptFamilies {
					pod, remote := ie.Pod(fam.v6), ie.Remote(fam.v6)
					// Outbound: through 15001 with the right original
					// destination; the remote still gets the bytes, from
					// the proxy's connection.
					interceptExpect(t, e, e.Pod, ie.AP(remote, ie.RemotePort), "remote", pod.String(), "outbound")
					// Inbound: through 15006; the app answers through the
					// proxy (which calls it from the passthrough address).
					mark := e.Proxy.Mark()
					interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort), "app", interceptPassthrough(fam.v6), "inbound")
					// The proxy sees the client's own address (TPROXY keeps
					// it on the socket; REDIRECT only rewrites the
					// destination).
					if src, err := netip.ParseAddrPort(e.Proxy.Since(mark)[0].Src); err != nil || src.Addr() != remote {
						t.Fatalf("%s: the proxy saw inbound client %s, want %s", fam.name, e.Proxy.Since(mark)[0].Src, remote)
					}
					// The tunnel port is not captured by REDIRECT; TPROXY
					// captures it, as istio-iptables does (its tunnel port
					// exclusion is in nat only).
					interceptTunnel(t, e, mode, fam.v6)
					// Loopback traffic of the app stays on loopback.
					lo := netip.MustParseAddr("127.0.0.1")
					if fam.v6 {
						lo = netip.IPv6Loopback()
					}
					interceptExpect(t, e, e.Pod, ie.AP(lo, ie.AppPort), "app", lo.String(), "")
					interceptExpect(t, e, e.Pod, ie.AP(pod, ie.AppPort), "app", pod.String(), "")
				}
			})
			// The same traffic with each backend (switching backends with
			// --reconcile also removes the rules from the previous one);
			// EBPF mode has none.
			if !ebpf {
				t.Run("backends", func(t *testing.T) {
					for _, backend := range []string{"legacy", "nftables", "nft"} {
						run("-i", "*", "-b", "*", "--iptables-backend", backend)
						for _, fam := range interceptFamilies {
							pod, remote := ie.Pod(fam.v6), ie.Remote(fam.v6)
							interceptExpect(t, e, e.Pod, ie.AP(remote, ie.RemotePort), "remote", pod.String(), "outbound")
							interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort), "app", interceptPassthrough(fam.v6), "inbound")
							interceptTunnel(t, e, mode, fam.v6)
						}
					}
				})
			}

			t.Run("proxy-owner-bypass", func(t *testing.T) {
				run("-i", "*", "-b", "*", "-u", "1337", "-g", "1337")
				for _, fam := range interceptFamilies {
					pod, remote := ie.Pod(fam.v6), ie.Remote(fam.v6)
					dst := ie.AP(remote, ie.RemotePort)
					for _, who := range []struct {
						uid, gid uint32
						listener string
					}{{ie.ProxyUID, ie.ProxyUID, ""}, {ie.OtherUID, ie.ProxyUID, ""}, {ie.ProxyUID, ie.OtherUID, ""}, {ie.OtherUID, ie.OtherUID, "outbound"}} {
						mark := e.Proxy.Mark()
						reply, err := e.DialAs(who.uid, who.gid, dst, "owner")
						if err != nil {
							t.Fatalf("%s: request as %d:%d: %v", fam.name, who.uid, who.gid, err)
						}
						if want := "remote " + pod.String() + " owner"; reply != want {
							t.Fatalf("%s: request as %d:%d: reply %q, want %q", fam.name, who.uid, who.gid, reply, want)
						}
						interceptCheckRecords(t, e, mark, dst, who.listener)
					}
					// The proxy calling its own pod's address goes through
					// the inbound side.
					mark := e.Proxy.Mark()
					reply, err := e.DialAs(ie.ProxyUID, ie.ProxyUID, ie.AP(pod, ie.AppPort), "self")
					if err != nil || reply != "app "+interceptPassthrough(fam.v6)+" self" {
						t.Fatalf("%s: proxy to its own pod: %q, %v", fam.name, reply, err)
					}
					interceptCheckRecords(t, e, mark, ie.AP(pod, ie.AppPort), "inbound")
					// Except to the tunnel port, which with REDIRECT
					// reaches the app directly (istio's "! --dport
					// 15008"); TPROXY's mangle capture takes it, as
					// istio's does.
					mark = e.Proxy.Mark()
					want, listener := "app "+pod.String()+" tunnel", ""
					if mode == "TPROXY" {
						want, listener = "app "+interceptPassthrough(fam.v6)+" tunnel", "inbound"
					}
					if reply, err := e.DialAs(ie.ProxyUID, ie.ProxyUID, ie.AP(pod, ie.TunnelPort), "tunnel"); err != nil || reply != want {
						t.Fatalf("%s: proxy to its own pod's tunnel port: %q, %v; want %q", fam.name, reply, err, want)
					}
					interceptCheckRecords(t, e, mark, ie.AP(pod, ie.TunnelPort), listener)
				}
			})

			t.Run("exclusions", func(t *testing.T) {
				run("-i", "*", "-b", "*", "-d", fmt.Sprint(ie.AppPort2), "-o", fmt.Sprint(ie.RemotePort2),
					"-x", ie.ExtraV4.String()+"/32,"+ie.ExtraV6.String()+"/128")
				for _, fam := range interceptFamilies {
					pod, remote, extra := ie.Pod(fam.v6), ie.Remote(fam.v6), ie.Extra(fam.v6)
					interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort2), "app", remote.String(), "")
					interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort), "app", interceptPassthrough(fam.v6), "inbound")
					interceptExpect(t, e, e.Pod, ie.AP(remote, ie.RemotePort2), "remote", pod.String(), "")
					interceptExpect(t, e, e.Pod, ie.AP(extra, ie.RemotePort), "remote", pod.String(), "")
					interceptExpect(t, e, e.Pod, ie.AP(remote, ie.RemotePort), "remote", pod.String(), "outbound")
				}
			})

			t.Run("lists", func(t *testing.T) {
				run("-b", fmt.Sprint(ie.AppPort2), "-i", "198.18.64.0/24,fd70:64::/64")
				for _, fam := range interceptFamilies {
					pod, remote, extra := ie.Pod(fam.v6), ie.Remote(fam.v6), ie.Extra(fam.v6)
					interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort), "app", remote.String(), "")
					interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort2), "app", interceptPassthrough(fam.v6), "inbound")
					interceptExpect(t, e, e.Pod, ie.AP(remote, ie.RemotePort), "remote", pod.String(), "outbound")
					interceptExpect(t, e, e.Pod, ie.AP(extra, ie.RemotePort), "remote", pod.String(), "")
				}
				// Outbound ports captured whatever the destination; no
				// inbound capture at all.
				run("-b", "", "-i", "", "-q", fmt.Sprint(ie.RemotePort))
				for _, fam := range interceptFamilies {
					pod, remote, extra := ie.Pod(fam.v6), ie.Remote(fam.v6), ie.Extra(fam.v6)
					interceptExpect(t, e, e.Pod, ie.AP(extra, ie.RemotePort), "remote", pod.String(), "outbound")
					interceptExpect(t, e, e.Pod, ie.AP(extra, ie.RemotePort2), "remote", pod.String(), "")
					interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort), "app", remote.String(), "")
				}
			})

			t.Run("dns", func(t *testing.T) {
				run("-i", "*", "-b", "*", "--redirect-dns", "--capture-all-dns")
				for _, fam := range interceptFamilies {
					pod, remote := ie.Pod(fam.v6), ie.Remote(fam.v6)
					before := len(e.RemoteDNSSources())
					interceptQuery(t, e, ie.AP(remote, ie.DNSPort), "proxy:remote-dns:")
					// The proxy's own upstream queries reached the remote
					// (they were not captured again; with the rules,
					// conntrack zones kept them apart from the app's).
					if srcs := e.RemoteDNSSources(); len(srcs) != before+3 || slices.ContainsFunc(srcs[before:], func(s string) bool { return s != ie.PodV4.String() }) {
						t.Fatalf("%s: remote DNS server saw %v after the queries, want three more from the proxy at %s", fam.name, srcs, ie.PodV4)
					}
					// A namespace that is not a pod is left alone.
					if ans, from, err := ie.Query(e.Remote, ie.Connected, ie.AP(remote, ie.DNSPort), "r"); err != nil || ans != "remote-dns:r" || from != ie.AP(remote, ie.DNSPort) {
						t.Fatalf("%s: the remote's own query: %q from %s, %v", fam.name, ans, from, err)
					}
					// DNS over TCP goes to the proxy's DNS port.
					interceptExpect(t, e, e.Pod, ie.AP(remote, ie.DNSPort), "remote", pod.String(), "dns-tcp")
				}
				// Only the pod's nameservers when not capturing all.
				resolv := filepath.Join(t.TempDir(), "resolv.conf")
				if err := os.WriteFile(resolv, []byte("search example\nnameserver "+ie.RemoteV4.String()+"\nnameserver "+ie.RemoteV6.String()+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				run("-i", "*", "-b", "*", "--redirect-dns", "--resolv-conf", resolv)
				for _, fam := range interceptFamilies {
					interceptQuery(t, e, ie.AP(ie.Remote(fam.v6), ie.DNSPort), "proxy:remote-dns:")
					interceptQuery(t, e, ie.AP(ie.Extra(fam.v6), ie.DNSPort), "remote-dns:")
				}
			})

			if ebpf {
				// The rest is not available in EBPF mode (refused: -k,
				// -c). After all the traffic, the namespace has neither
				// rule nor conntrack entry.
				interceptEBPFChecks(t, e)
				return
			}

			// Connections of a VM behind a kube-virt interface are the
			// pod's outbound traffic.
			t.Run("kube-virt-interface", func(t *testing.T) {
				vm := e.AddVM()
				run("-i", "*", "-b", "*", "-k", "mwtik0")
				interceptExpect(t, e, vm, ie.AP(ie.RemoteV4, ie.RemotePort), "remote", ie.PodV4.String(), "outbound")
				// Not included: routed as it is, never taken for inbound
				// traffic either. The exclusions (-x) are the pod's own
				// (OUTPUT): an included range reaches the proxy from the
				// VM even where excluded, as with istio-iptables.
				run("-i", "198.18.65.0/24", "-b", "*", "-k", "mwtik0", "-x", "198.18.65.1/32")
				interceptExpect(t, e, vm, ie.AP(ie.ExtraV4, ie.RemotePort), "remote", ie.PodV4.String(), "outbound")
				interceptExpect(t, e, vm, ie.AP(ie.RemoteV4, ie.RemotePort), "remote", ie.VMAddr.String(), "")
			})

			t.Run("exclude-interface", func(t *testing.T) {
				run("-i", "*", "-b", "*", "-c", "mwti0")
				for _, fam := range interceptFamilies {
					pod, remote := ie.Pod(fam.v6), ie.Remote(fam.v6)
					interceptExpect(t, e, e.Pod, ie.AP(remote, ie.RemotePort), "remote", pod.String(), "")
					interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort), "app", remote.String(), "")
				}
			})

		})
	}
}

// interceptQuery sends a DNS query to dst from the pod, from each kind of
// UDP socket resolvers use, and checks the answer (wantPrefix "proxy:..."
// when the proxy's DNS port should have answered it) and that it comes
// from dst as the app sees it (captured: as the rules' NAT, or EBPF mode's
// hooks, put it back).
func interceptQuery(t *testing.T, e *ie.Env, dst netip.AddrPort, wantPrefix string) {
	t.Helper()
	for _, k := range []ie.QuerySocket{ie.Connected, ie.Unconnected, ie.DualStack} {
		mark := e.Proxy.Mark()
		q := fmt.Sprintf("q%d", mark)
		ans, from, err := ie.Query(e.Pod, k, dst, q)
		if err != nil {
			t.Fatalf("DNS query to %s (%s socket): %v", dst, k, err)
		}
		if ans != wantPrefix+q || from != dst {
			t.Fatalf("DNS query to %s (%s socket): answer %q from %s, want %q from %s", dst, k, ans, from, wantPrefix+q, dst)
		}
		recs := e.Proxy.Since(mark)
		if captured := strings.HasPrefix(wantPrefix, "proxy:"); captured != (len(recs) == 1 && recs[0].Event == "dns") {
			t.Fatalf("DNS query to %s (%s socket): proxy records %+v (captured: %v)", dst, k, recs, captured)
		}
	}
}

// interceptRuleState is what a backend shows of the pod's rules and the
// policy routing, normalized (no counters, no comments, no empty built-in
// chain headers), for before/after comparisons.
func interceptRuleState(t *testing.T, e *ie.Env, backend string) string {
	t.Helper()
	var b strings.Builder
	var tools []string
	switch backend {
	case "nftables":
		tools = []string{"nft -s list ruleset"} // -s: no counters, which traffic changes
	case "legacy":
		tools = []string{"iptables-legacy-save", "ip6tables-legacy-save"}
	default:
		tools = []string{"iptables-nft-save", "ip6tables-nft-save"}
	}
	tools = append(tools, "ip -4 rule", "ip -6 rule", "ip -4 route show table all", "ip -6 route show table all", "ip -6 addr show dev lo")
	builtin := regexp.MustCompile(`^:(PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) `)
	for _, tool := range tools {
		f := strings.Fields(tool)
		out, err := e.Pod.Exec(f[0], f[1:]...)
		if err != nil {
			t.Fatalf("%s: %v\n%s", tool, err, out)
		}
		fmt.Fprintf(&b, "== %s\n", tool)
		for _, line := range strings.Split(out, "\n") {
			// Link-local addresses come and go with DAD on their own.
			if strings.TrimSpace(line) == "" || strings.HasPrefix(line, "#") || builtin.MatchString(line) || strings.Contains(line, "valid_lft") || strings.Contains(line, "fe80:") {
				continue
			}
			b.WriteString(strings.ReplaceAll(line, " [0:0]", "") + "\n")
		}
	}
	return regexp.MustCompile(`(?m)^\*\w+\nCOMMIT\n`).ReplaceAllString(b.String(), "")
}

// interceptForeignRules installs rules that are not meshwire's, which every
// step must leave alone.
func interceptForeignRules(t *testing.T, e *ie.Env, backend string) {
	t.Helper()
	var cmd *exec.Cmd
	switch backend {
	case "nftables":
		cmd = exec.Command("ip", "netns", "exec", e.Pod.Name, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader("table inet foreign {\n chain out { type filter hook output priority 0; udp dport 9999 accept; }\n}\n")
	default:
		tool := "iptables-nft-restore"
		if backend == "legacy" {
			tool = "iptables-legacy-restore"
		}
		cmd = exec.Command("ip", "netns", "exec", e.Pod.Name, tool, "--noflush")
		cmd.Stdin = strings.NewReader("*nat\n:FOREIGN - [0:0]\n-A FOREIGN -j RETURN\n-A OUTPUT -p udp --dport 9999 -j FOREIGN\nCOMMIT\n*mangle\n-A PREROUTING -p udp --dport 9999 -j ACCEPT\nCOMMIT\n")
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("foreign rules: %v\n%s", err, out)
	}
	if out, err := e.Pod.Exec("ip", "rule", "add", "fwmark", "0x99", "lookup", "99"); err != nil {
		t.Fatalf("foreign ip rule: %v\n%s", err, out)
	}
}

// TestInterceptRulesLifecycle checks re-run, reconcile and cleanup-only by
// comparing what the firewall and the routing show before and after, for
// each backend, with rules of someone else's around.
func TestInterceptRulesLifecycle(t *testing.T) {
	for _, backend := range []string{"nft", "legacy", "nftables"} {
		t.Run(backend, func(t *testing.T) {
			h := harness.New(t)
			h.CheckNoLeaks()
			e := ie.New(t, h)
			interceptForeignRules(t, e, backend)
			state := func() string { return interceptRuleState(t, e, backend) }
			same := func(step, want string) {
				t.Helper()
				if got := state(); got != want {
					t.Fatalf("%s changed the rules:\n--- want\n%s\n--- got\n%s", step, want, got)
				}
			}
			clean := state()
			a := []string{"--iptables-backend", backend, "-m", "TPROXY", "-i", "*", "-b", "*", "-d", "15090,15021", "--redirect-dns", "--capture-all-dns"}
			b := []string{"--iptables-backend", backend, "-m", "REDIRECT", "-i", "10.96.0.0/12", "-b", "8000"}

			// Dry run: prints the rules, changes nothing.
			code, out := e.IptablesInit(append(a, "--dry-run")...)
			if code != 0 || !strings.Contains(strings.ToUpper(strings.ReplaceAll(out, "-", "_")), "ISTIO_") || !strings.Contains(out, "1337") {
				t.Fatalf("dry run: exit %d\n%s", code, out)
			}
			same("--dry-run", clean)

			e.MustIptablesInit(a...)
			installedA := state()
			if installedA == clean || !strings.Contains(installedA, "lookup 133") || !strings.Contains(installedA, "::6/128") {
				t.Fatalf("TPROXY install shows no rules or no policy routing:\n%s", installedA)
			}
			if out := e.MustIptablesInit(a...); !strings.Contains(out, "nothing to do") {
				t.Fatalf("re-run did not find the rules in place:\n%s", out)
			}
			same("a re-run", installedA)

			// Other flags without --reconcile: refused, nothing changed.
			if code, out := e.IptablesInit(b...); code != 1 || !strings.Contains(out, "--reconcile") {
				t.Fatalf("other flags without --reconcile: exit %d\n%s", code, out)
			}
			same("a refused run", installedA)
			// Bad flags: exit 2, nothing changed.
			if code, out := e.IptablesInit(append(b, "-p", "0")...); code != 2 || !strings.Contains(out, "--envoy-port") {
				t.Fatalf("bad flags: exit %d\n%s", code, out)
			}
			same("a bad command line", installedA)

			e.MustIptablesInit(append(b, "--reconcile")...)
			reconciled := state()
			code, out = e.IptablesInit(append(b, "--cleanup-only", "--dry-run")...)
			wantGone := "ISTIO_OUTPUT"
			if backend == "nftables" {
				wantGone = "delete table inet istio-proxy-nat"
			}
			if code != 0 || !strings.Contains(out, wantGone) {
				t.Fatalf("cleanup dry run: exit %d\n%s", code, out)
			}
			same("--cleanup-only --dry-run", reconciled)
			e.MustIptablesInit(append(b, "--cleanup-only")...)
			same("--cleanup-only", clean)
			// What reconcile left is exactly a fresh install of the new
			// flags (the TPROXY routing is gone too).
			e.MustIptablesInit(b...)
			same("a fresh install of the reconciled flags", reconciled)
			e.MustIptablesInit("--cleanup-only")
			same("--cleanup-only", clean)
			e.MustIptablesInit("--cleanup-only")
			same("a second --cleanup-only", clean)
		})
	}
}

// TestInterceptValidation checks --run-validation: success with working
// rules, exit 126 without them.
func TestInterceptValidation(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	e := ie.New(t, h)
	code, out := e.IptablesInit("--run-validation", "--skip-rule-apply", "--probe-timeout", "1s")
	if code != 126 || !strings.Contains(out, "validation failed") {
		t.Fatalf("validation without rules: exit %d, want 126\n%s", code, out)
	}
	for _, mode := range []string{"REDIRECT", "TPROXY"} {
		out := e.MustIptablesInit("-m", mode, "-i", "*", "-b", "*", "--reconcile", "--run-validation", "--probe-timeout", "2s")
		if !strings.Contains(out, "validation passed") {
			t.Fatalf("%s: %s", mode, out)
		}
	}
	// Only a list captured: validation probes inside it.
	out = e.MustIptablesInit("-i", "198.18.70.0/24,fd70:70::/64", "-b", "*", "--reconcile", "--run-validation", "--probe-timeout", "2s")
	if !strings.Contains(out, "validation passed") {
		t.Fatal(out)
	}
	e.MustIptablesInit("--cleanup-only")
}

// TestInterceptBadFlags runs iptables-init with bad command lines in a pod
// that has rules: each exits 2 naming the flag, and nothing changes.
func TestInterceptBadFlags(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	e := ie.New(t, h)
	e.MustIptablesInit("-i", "*", "-b", "*")
	before := interceptRuleState(t, e, "nft")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "--bogus"},
		{[]string{"-p", "70000"}, "--envoy-port"},
		{[]string{"-i", "10.0.0.300/8"}, "--istio-service-cidr"},
		{[]string{"-m", "NAT"}, "--istio-inbound-interception-mode"},
		{[]string{"-b", "http"}, "--istio-inbound-ports"},
		{[]string{"-z", "15001"}, "--inbound-capture-port"},
		{[]string{"--cleanup-only", "--reconcile"}, "--reconcile"},
		{[]string{"--iptables-backend", "ebtables"}, "--iptables-backend"},
	} {
		code, out := e.IptablesInit(tc.args...)
		if code != 2 || !strings.Contains(out, tc.want) {
			t.Errorf("%v: exit %d, want 2 naming %s\n%s", tc.args, code, tc.want, out)
		}
	}
	if after := interceptRuleState(t, e, "nft"); after != before {
		t.Fatalf("a bad command line changed the rules:\n%s\n---\n%s", before, after)
	}
	e.MustIptablesInit("--cleanup-only")
}

// interceptPluginList chains meshwire's loopback plugin (for a prevResult)
// and the intercept plugin with the given keys.
func interceptPluginList(version, keys string) string {
	return fmt.Sprintf(`{"cniVersion":%q,"name":"mwti-mesh","plugins":[{"type":"loopback"},{"type":"intercept"%s}]}`, version, keys)
}

// TestInterceptPlugin runs the intercept CNI plugin through libcni, for
// every spec version, and checks that the rules it installs carry real
// traffic through the proxy (REDIRECT and TPROXY), that CHECK notices
// missing rules, and that DEL removes everything, also twice and without a
// namespace.
func TestInterceptPlugin(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	e := ie.New(t, h)
	clean := interceptRuleState(t, e, "nft")
	for _, mode := range []string{"REDIRECT", "TPROXY"} {
		t.Run(mode, func(t *testing.T) {
			e.StartProxy(mode == "TPROXY")
			defer e.StopProxy()
			keys := fmt.Sprintf(`,"istio-service-cidr":"*","istio-inbound-ports":["*"],"istio-inbound-interception-mode":%q,"dual-stack":true`, mode)
			a := h.Attach(h.ConfList(interceptPluginList("1.1.0", keys)), e.Pod, "lo", nil)
			res := a.MustAdd()
			if len(res.Interfaces) != 1 || res.Interfaces[0].Name != "lo" {
				t.Fatalf("ADD did not pass the prevResult on: %+v", res)
			}
			if err := a.Check(); err != nil {
				t.Fatalf("CHECK after ADD: %v", err)
			}
			for _, fam := range interceptFamilies {
				pod, remote := ie.Pod(fam.v6), ie.Remote(fam.v6)
				interceptExpect(t, e, e.Pod, ie.AP(remote, ie.RemotePort), "remote", pod.String(), "outbound")
				interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort), "app", interceptPassthrough(fam.v6), "inbound")
			}
			// A repeated ADD changes nothing.
			installed := interceptRuleState(t, e, "nft")
			a.MustAdd()
			if got := interceptRuleState(t, e, "nft"); got != installed {
				t.Fatalf("a repeated ADD changed the rules:\n%s\n---\n%s", installed, got)
			}
			if mode == "TPROXY" {
				// CHECK notices missing policy routing.
				if out, err := e.Pod.Exec("ip", "-6", "rule", "del", "fwmark", "1337", "lookup", "133"); err != nil {
					t.Fatalf("remove the IPv6 rule: %v %s", err, out)
				}
				if err := a.Check(); err == nil || !strings.Contains(err.Error(), "rule add fwmark") {
					t.Fatalf("CHECK with the IPv6 policy rule gone: %v", err)
				}
				a.MustAdd() // puts it back
				if err := a.Check(); err != nil {
					t.Fatalf("CHECK after a repeated ADD: %v", err)
				}
			}
			// CHECK notices a missing rule.
			if out, err := e.Pod.Exec("iptables-nft", "-t", "nat", "-F", "ISTIO_OUTPUT"); err != nil {
				t.Fatalf("flush: %v %s", err, out)
			}
			if err := a.Check(); err == nil {
				t.Fatal("CHECK passed with ISTIO_OUTPUT flushed")
			}
			if err := a.Del(); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if err := a.Del(); err != nil {
				t.Fatalf("second DEL: %v", err)
			}
			// loopback's DEL took lo down (and its addresses and routes
			// with it): bring it back before comparing.
			if out, err := e.Pod.Exec("ip", "link", "set", "lo", "up"); err != nil {
				t.Fatalf("lo up: %v %s", err, out)
			}
			if got := interceptRuleState(t, e, "nft"); got != clean {
				t.Fatalf("DEL left rules or routes:\n%s\n--- want\n%s", got, clean)
			}
		})
	}
	t.Run("versions", func(t *testing.T) {
		for _, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
			a := h.Attach(h.ConfList(interceptPluginList(v, `,"istio-service-cidr":"*"`)), e.Pod, "lo", nil)
			a.MustAdd()
			if gte(v, "0.4.0") {
				if err := a.Check(); err != nil {
					t.Fatalf("%s: CHECK: %v", v, err)
				}
			}
			if err := a.Del(); err != nil {
				t.Fatalf("%s: DEL: %v", v, err)
			}
		}
		list := h.ConfList(interceptPluginList("1.1.0", ""))
		if err := h.Status(list); err != nil {
			t.Fatalf("STATUS: %v", err)
		}
		if err := h.GC(list); err != nil {
			t.Fatalf("GC: %v", err)
		}
	})
	t.Run("del-without-netns", func(t *testing.T) {
		stdin := []byte(`{"cniVersion":"1.1.0","name":"mwti-mesh","type":"intercept"}`)
		for _, ns := range []string{"", "/run/netns/mwti-no-such-ns"} {
			r := h.Exec("intercept", map[string]string{"CNI_COMMAND": "DEL", "CNI_CONTAINERID": "c1", "CNI_IFNAME": "lo", "CNI_NETNS": ns, "CNI_PATH": h.BinDir}, stdin)
			if r.ExitCode != 0 {
				t.Fatalf("DEL with netns %q: exit %d %s", ns, r.ExitCode, r.Stdout)
			}
		}
	})
	t.Run("bad-config", func(t *testing.T) {
		for _, tc := range []struct{ keys, field string }{
			{`,"envoy-port":70000`, "envoy-port"},
			{`,"istio-service-cidr":"10.0.0.0/99"`, "istio-service-cidr"},
			{`,"dry-run":true`, "dry-run"},
		} {
			a := h.Attach(h.ConfList(interceptPluginList("1.1.0", tc.keys)), e.Pod, "lo", nil)
			_, err := a.Add()
			var ce *types.Error
			if !asCNIError(err, &ce) || ce.Code != 7 || !strings.Contains(ce.Msg+ce.Details, tc.field) {
				t.Fatalf("%s: %v, want code 7 naming %s", tc.keys, err, tc.field)
			}
		}
		if got := interceptRuleState(t, e, "nft"); got != clean {
			t.Fatalf("a failed ADD left rules:\n%s", got)
		}
	})
}

// TestInterceptReconcileNoEscape switches a pod between REDIRECT and TPROXY
// with --reconcile, over and over, while a client keeps opening inbound
// connections: none of them may reach the app without the proxy. (A
// connection whose handshake the switch cuts in two may fail; those are
// counted and must stay rare.)
func TestInterceptReconcileNoEscape(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	e := ie.New(t, h)
	e.StartProxy(true) // its transparent inbound listener takes both kinds
	e.MustIptablesInit("-m", "REDIRECT", "-i", "*", "-b", "*")
	stop := make(chan struct{})
	type result struct {
		n       int
		escaped []string
		failed  []error
	}
	done := make(chan result)
	go func() {
		var r result
		for {
			select {
			case <-stop:
				done <- r
				return
			default:
			}
			reply, err := ie.Request(e.Remote, ie.AP(ie.PodV4, ie.AppPort), "x")
			r.n++
			switch {
			case err != nil:
				r.failed = append(r.failed, err)
			case reply != "app 127.0.0.6 x":
				r.escaped = append(r.escaped, reply)
			}
		}
	}()
	for i := 0; i < 10; i++ {
		mode := "TPROXY"
		if i%2 == 1 {
			mode = "REDIRECT"
		}
		e.MustIptablesInit("-m", mode, "-i", "*", "-b", "*", "--reconcile")
	}
	close(stop)
	r := <-done
	if len(r.escaped) > 0 || r.n == 0 {
		t.Fatalf("%d of %d connections reached the app without the proxy: %v", len(r.escaped), r.n, r.escaped)
	}
	if len(r.failed)*100 > r.n {
		t.Fatalf("%d of %d connections failed during the switches: %v", len(r.failed), r.n, r.failed)
	}
	t.Logf("%d connections during 10 mode switches, all through the proxy (%d failed: %v)", r.n, len(r.failed), r.failed)
	e.MustIptablesInit("--cleanup-only")
}

// TestInterceptNetworkNamespaceFlag runs iptables-init from the host with
// --network-namespace: the rules land in that namespace and nowhere else
// (a harmless rule set: only outbound port 1 captured).
func TestInterceptNetworkNamespaceFlag(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	e := ie.New(t, h)
	if code, out := interceptRunHost(h, "--network-namespace", e.Pod.Path, "-i", "", "-b", "", "-q", "1"); code != 0 {
		t.Fatalf("iptables-init --network-namespace: exit %d\n%s", code, out)
	}
	if st := interceptRuleState(t, e, "nft"); !strings.Contains(st, "--dport 1 -j ISTIO_REDIRECT") {
		t.Fatalf("rules not in the pod namespace:\n%s", st)
	}
	if code, out := interceptRunHost(h, "--network-namespace", e.Pod.Path, "--cleanup-only"); code != 0 {
		t.Fatalf("cleanup: exit %d\n%s", code, out)
	}
	if code, out := interceptRunHost(h, "--network-namespace", "/run/netns/mwti-no-such-ns", "-q", "1"); code != 1 || !strings.Contains(out, "--network-namespace") {
		t.Fatalf("missing namespace: exit %d\n%s", code, out)
	}
}

func interceptRunHost(h *harness.H, args ...string) (int, string) {
	out, err := exec.Command(filepath.Join(h.BinDir, "iptables-init"), args...).CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out)
	}
	return 0, string(out)
}

// TestInterceptIPv6Decision checks when IPv6 rules are programmed, as
// istio-iptables decides: the pod's first address is IPv6, or dual stack
// is asked for (--dual-stack, ISTIO_DUAL_STACK) and the pod has an IPv6
// address. The test pod's first address is IPv4.
func TestInterceptIPv6Decision(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	e := ie.New(t, h)
	v6Rules := func() bool {
		out, err := e.Pod.Exec("ip6tables-nft-save")
		if err != nil {
			t.Fatalf("ip6tables-nft-save: %v", err)
		}
		return strings.Contains(out, "ISTIO_OUTPUT")
	}
	single := []string{"ISTIO_DUAL_STACK=false"}
	run := func(env []string, args ...string) {
		t.Helper()
		if code, out := e.IptablesInitEnv(env, append([]string{"-i", "*", "-b", "*", "--reconcile"}, args...)...); code != 0 {
			t.Fatalf("iptables-init %q with %q: exit %d\n%s", args, env, code, out)
		}
	}
	run(single)
	if v6Rules() {
		t.Fatal("IPv6 rules in a pod whose first address is IPv4, without dual stack")
	}
	run(single, "--dual-stack")
	if !v6Rules() {
		t.Fatal("no IPv6 rules with --dual-stack")
	}
	run(single)
	if v6Rules() {
		t.Fatal("IPv6 rules left after reconciling without dual stack")
	}
	if out, err := e.Pod.Exec("ip", "-6", "addr", "del", ie.PodV6.String()+"/64", "dev", "mwti0"); err != nil {
		t.Fatalf("remove the pod's IPv6 address: %v %s", err, out)
	}
	run(nil) // ISTIO_DUAL_STACK=true
	if v6Rules() {
		t.Fatal("IPv6 rules with dual stack in a pod without an IPv6 address")
	}
	e.MustIptablesInit("--cleanup-only")
}
