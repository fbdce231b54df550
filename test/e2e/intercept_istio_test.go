//go:build kernel

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/meshwire/meshwire/test/harness"
	ie "github.com/meshwire/meshwire/test/interceptenv"
)

// istioInitArgs is the init container's argument list of Istio's current
// sidecar injection template (istio/istio 1.30.3 and master,
// manifests/charts/istio-control/istio-discovery/files/injection-template.yaml)
// rendered with the chart's default values, mode as given. The template
// then appends, depending on values: --log_as_json (global.logAsJson),
// --run-validation --skip-rule-apply (istio-cni) or --force-apply
// (global.proxy_init.forceApplyIptables), --native-nftables
// (global.nativeNftables).
func istioInitArgs(mode string, extra ...string) []string {
	args := []string{"istio-iptables", "-p", "15001", "-z", "15006", "-u", "1337", "-m", mode,
		"-i", "*", "-x", "", "-b", "*", "-d", "15090,15021,15020", "--log_output_level=default:info"}
	return append(args, extra...)
}

// Groups of the pod's users: the proxy metadata below leaves the
// connections of excludedGID alone.
const (
	capturedGID = ie.OtherUID // 4242
	excludedGID = 4343
)

// istioInitEnv is what an init container's env carries from the proxy
// metadata: the variables istio-iptables reads without a flag, and
// variables that stand for flags.
var istioInitEnv = []string{
	fmt.Sprintf("ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE=%d", excludedGID),
	"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR=127.0.0.0/8",
	"ISTIO_META_DNS_CAPTURE=true",
	"CAPTURE_ALL_DNS=true",
	"INVALID_DROP=true",
}

// istioJSONLines checks that every line of out is one of Istio's JSON log
// lines and returns their messages.
func istioJSONLines(t *testing.T, out string) []string {
	t.Helper()
	var msgs []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var l struct{ Level, Time, Msg string }
		if err := json.Unmarshal([]byte(line), &l); err != nil || l.Level == "" || l.Time == "" {
			t.Fatalf("not a JSON log line: %q (%v)\n%s", line, err, out)
		}
		msgs = append(msgs, l.Msg)
	}
	return msgs
}

// istioDialGroups checks which groups' outbound connections the proxy
// sees (as user OtherUID).
func istioDialGroups(t *testing.T, e *ie.Env, v6 bool, groups map[uint32]string) {
	t.Helper()
	pod, dst := ie.Pod(v6), ie.AP(ie.Remote(v6), ie.RemotePort)
	for gid, listener := range groups {
		mark := e.Proxy.Mark()
		reply, err := e.DialAs(ie.OtherUID, gid, dst, "grp")
		if err != nil || reply != "remote "+pod.String()+" grp" {
			t.Fatalf("request as %d:%d to %s: %q, %v", ie.OtherUID, gid, dst, reply, err)
		}
		interceptCheckRecords(t, e, mark, dst, listener)
	}
}

func istioRules(t *testing.T, e *ie.Env, tool string) string {
	t.Helper()
	out, err := e.Pod.Exec(tool)
	if err != nil {
		t.Fatalf("%s: %v\n%s", tool, err, out)
	}
	return out
}

func istioWantRules(t *testing.T, rules string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(rules, w) {
			t.Fatalf("rules lack %q:\n%s", w, rules)
		}
	}
}

// TestInterceptIstioInjected runs the built iptables-init with the exact
// argument list Istio's injector gives istio-init (subcommand word
// included) and the variables of istioInitEnv, then checks the rules and
// real traffic as TestInterceptTraffic does: the istio-cni line
// (--run-validation --skip-rule-apply); with --force-apply and
// --log_as_json; with --native-nftables and ISTIO_OUTBOUND_OWNER_GROUPS;
// TPROXY with INBOUND_TPROXY_MARK; --cni-mode from the host with
// --force-iptables-binary=legacy; bad variables.
func TestInterceptIstioInjected(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	e := ie.New(t, h)
	run := func(t *testing.T, env []string, args ...string) string {
		t.Helper()
		code, out := e.IptablesInitEnv(env, args...)
		if code != 0 {
			t.Fatalf("iptables-init %q with %q: exit %d\n%s", args, env, code, out)
		}
		return out
	}

	t.Run("istio-cni-validation", func(t *testing.T) {
		// With istio-cni the rules come from the node; the init container
		// only validates them (as root here, whose group is captured),
		// before the proxy runs (validation listens on its port).
		run(t, istioInitEnv, istioInitArgs("REDIRECT", "--native-nftables", "--force-apply")...)
		out := run(t, istioInitEnv, istioInitArgs("REDIRECT", "--run-validation", "--skip-rule-apply", "--probe-timeout", "2s")...)
		if !strings.Contains(out, "validation passed") {
			t.Fatal(out)
		}
		e.MustIptablesInit("--cleanup-only")
	})

	e.StartProxy(true) // its transparent inbound listener takes both modes
	t.Run("redirect", func(t *testing.T) {
		args := istioInitArgs("REDIRECT", "--log_as_json", "--force-apply")
		msgs := istioJSONLines(t, run(t, istioInitEnv, args...))
		if len(msgs) != 1 || !strings.Contains(msgs[0], "REDIRECT interception installed for IPv4 and IPv6") {
			t.Fatalf("messages %q", msgs)
		}
		rules := istioRules(t, e, "iptables-nft-save")
		istioWantRules(t, rules, "-A ISTIO_INBOUND -p tcp -m tcp --dport 15021 -j RETURN",
			fmt.Sprintf("-A ISTIO_OUTPUT -m owner --gid-owner %d -j RETURN", excludedGID),
			"-A ISTIO_OUTPUT -d 127.0.0.0/8 -j RETURN", "--ctstate INVALID", "--to-ports 15053")
		for _, fam := range interceptFamilies {
			pod, remote := ie.Pod(fam.v6), ie.Remote(fam.v6)
			interceptExpect(t, e, e.Pod, ie.AP(remote, ie.RemotePort), "remote", pod.String(), "outbound")
			interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort), "app", interceptPassthrough(fam.v6), "inbound")
			interceptExpect(t, e, e.Remote, ie.AP(pod, ie.TunnelPort), "app", remote.String(), "")
			istioDialGroups(t, e, fam.v6, map[uint32]string{capturedGID: "outbound", excludedGID: ""})
			interceptQuery(t, e, ie.AP(remote, ie.DNSPort), "proxy:remote-dns:")
		}

		// --force-apply rewrites what is in place, without doubling it;
		// without it, the same line finds nothing to do.
		msgs = istioJSONLines(t, run(t, istioInitEnv, args...))
		if len(msgs) != 1 || !strings.Contains(msgs[0], "installed") {
			t.Fatalf("forced re-run: %q", msgs)
		}
		if again := istioRules(t, e, "iptables-nft-save"); interceptNormalize(again) != interceptNormalize(rules) {
			t.Fatalf("forced re-run changed the rules:\n%s\n---\n%s", rules, again)
		}
		if out := run(t, istioInitEnv, istioInitArgs("REDIRECT")...); !strings.Contains(out, "nothing to do") {
			t.Fatalf("plain re-run: %s", out)
		}
	})

	t.Run("native-nftables-owner-groups", func(t *testing.T) {
		// Only the group captured is; --force-apply replaces the
		// iptables-nft rules (without it, or --reconcile, that is refused).
		env := append([]string{fmt.Sprintf("ISTIO_OUTBOUND_OWNER_GROUPS=%d", capturedGID)}, istioInitEnv...)
		if code, out := e.IptablesInitEnv(env, istioInitArgs("REDIRECT", "--native-nftables")...); code != 1 || !strings.Contains(out, "--reconcile") {
			t.Fatalf("native nftables over iptables rules without --force-apply: exit %d\n%s", code, out)
		}
		run(t, env, istioInitArgs("REDIRECT", "--force-apply", "--native-nftables")...)
		if rules := istioRules(t, e, "iptables-nft-save"); strings.Contains(rules, "ISTIO_") {
			t.Fatalf("iptables rules left:\n%s", rules)
		}
		nft, err := e.Pod.Exec("nft", "list", "table", "inet", "istio-proxy-nat")
		if err != nil {
			t.Fatalf("no native table: %v\n%s", err, nft)
		}
		istioWantRules(t, nft, fmt.Sprintf("meta skgid != %d counter", capturedGID), "ip daddr 127.0.0.0/8 counter")
		for _, fam := range interceptFamilies {
			pod, remote := ie.Pod(fam.v6), ie.Remote(fam.v6)
			istioDialGroups(t, e, fam.v6, map[uint32]string{capturedGID: "outbound", excludedGID: ""})
			// The test itself runs as root (group 0): not captured.
			interceptExpect(t, e, e.Pod, ie.AP(remote, ie.RemotePort), "remote", pod.String(), "")
			interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort), "app", interceptPassthrough(fam.v6), "inbound")
		}
	})

	t.Run("tproxy-env-mark", func(t *testing.T) {
		// From native nftables back to iptables-nft, as istio's break
		// glass variable says.
		env := append([]string{"INBOUND_TPROXY_MARK=0x200", "FORCE_IPTABLES_BINARY=nft"}, istioInitEnv...)
		run(t, env, istioInitArgs("TPROXY", "--force-apply")...)
		rules, err := e.Pod.Exec("ip", "-4", "rule")
		if err != nil || !strings.Contains(rules, "fwmark 0x200 lookup 133") {
			t.Fatalf("TPROXY policy routing for mark 0x200: %v\n%s", err, rules)
		}
		istioWantRules(t, istioRules(t, e, "iptables-nft-save"), "-A ISTIO_TPROXY ! -d 127.0.0.0/8 -p tcp -j TPROXY", "--tproxy-mark 0x200/0xffffffff")
		for _, fam := range interceptFamilies {
			pod, remote := ie.Pod(fam.v6), ie.Remote(fam.v6)
			interceptExpect(t, e, e.Remote, ie.AP(pod, ie.AppPort), "app", interceptPassthrough(fam.v6), "inbound")
			istioDialGroups(t, e, fam.v6, map[uint32]string{capturedGID: "outbound", excludedGID: ""})
			interceptExpect(t, e, e.Pod, ie.AP(remote, ie.RemotePort), "remote", pod.String(), "outbound")
		}
	})

	t.Run("cni-mode-from-host", func(t *testing.T) {
		// The node's xtables lock is held the whole time: legacy iptables
		// would wait for it (10 s, then fail); in CNI mode it locks the
		// pod's namespace file instead.
		lock, err := os.OpenFile("/run/xtables.lock", os.O_CREATE|os.O_RDONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		defer lock.Close()
		if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
			t.Fatal(err)
		}
		args := istioInitArgs("REDIRECT", "--force-apply", "--force-iptables-binary=legacy", "--cni-mode", "--network-namespace", e.Pod.Path)
		cmd := exec.Command(filepath.Join(h.BinDir, "iptables-init"), args...)
		cmd.Env = append(os.Environ(), istioInitEnv...)
		start := time.Now()
		out, err := cmd.CombinedOutput()
		syscall.Flock(int(lock.Fd()), syscall.LOCK_UN)
		if err != nil || time.Since(start) > 5*time.Second {
			t.Fatalf("--cni-mode with the node's lock held: %v after %v\n%s", err, time.Since(start), out)
		}
		istioWantRules(t, istioRules(t, e, "iptables-legacy-save"), "-A ISTIO_OUTPUT -d 127.0.0.0/8 -j RETURN")
		if rules := istioRules(t, e, "iptables-nft-save"); strings.Contains(rules, "ISTIO_") {
			t.Fatalf("iptables-nft rules left:\n%s", rules)
		}
		interceptExpect(t, e, e.Pod, ie.AP(ie.RemoteV4, ie.RemotePort), "remote", ie.PodV4.String(), "outbound")
	})

	t.Run("bad-variables", func(t *testing.T) {
		before := interceptRuleState(t, e, "legacy")
		for _, v := range []string{"ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE=mwti-no-such-group", "ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR=10.0.0.0/8",
			"ISTIO_OUTBOUND_OWNER_GROUPS=*,1", "FORCE_IPTABLES_BINARY=xtables", "INBOUND_TPROXY_MARK=high"} {
			name := strings.SplitN(v, "=", 2)[0]
			code, out := e.IptablesInitEnv([]string{v}, istioInitArgs("REDIRECT", "--force-apply")...)
			if code != 2 || !strings.Contains(out, name) {
				t.Errorf("%s: exit %d, want 2 naming %s\n%s", v, code, name, out)
			}
		}
		if after := interceptRuleState(t, e, "legacy"); after != before {
			t.Fatalf("a bad variable changed the rules:\n%s\n---\n%s", before, after)
		}
	})

	e.MustIptablesInit("--cleanup-only")
}

// interceptNormalize drops what changes between two saves of the same
// rules (the header and footer comments with their times).
func interceptNormalize(save string) string {
	var out []string
	for _, line := range strings.Split(save, "\n") {
		if !strings.HasPrefix(line, "#") {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}
