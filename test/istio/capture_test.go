//go:build kernel

package istio

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/test/harness"
)

// captureCase is one case of istio-iptables' and istio-nftables' capture
// tests (getCommonTestCases in tools/istio-{iptables,nftables}/pkg/capture/
// run_test.go), as the flags, variables and pod that give iptables-init
// the same configuration. The tests' base configuration is istio's
// defaults with uid and gid 1337.
type captureCase struct {
	name     string
	args     []string // flags besides -u and -g
	uid, gid string   // -u, -g ("" is 1337)
	env      []string
	ipv6     bool     // istio's EnableIPv6: the pod's first address is IPv6
	dns      []string // nameservers of the pod's /etc/resolv.conf
	nftOnly  bool     // a case of istio-nftables only
}

var captureCases = []captureCase{
	{name: "ipv6-empty-inbound-ports", args: []string{"-b", ""}, ipv6: true},
	{name: "ip-range", args: []string{"-x", "1.1.0.0/16", "-i", "9.9.0.0/16", "--redirect-dns"}, gid: "1,2", uid: "3,4", dns: []string{"127.0.0.53"}},
	{name: "tproxy", args: []string{"-m", "TPROXY", "-b", "*", "-x", "1.1.0.0/16", "-i", "9.9.0.0/16", "--redirect-dns", "-c", "not-istio-nic"}, dns: []string{"127.0.0.53"}, ipv6: true},
	{name: "ipv6-inbound-ports", args: []string{"-b", "4000,5000"}, ipv6: true},
	{name: "ipv6-virt-interfaces", args: []string{"-b", "4000,5000", "-k", "eth0,eth1"}, ipv6: true},
	{name: "ipv6-ipnets", args: []string{"-b", "4000,5000", "-d", "6000,7000,", "-k", "eth0,eth1", "-x", "2001:db8::/32", "-i", "2001:db8::/32"}, ipv6: true},
	{name: "ipv6-uid-gid", args: []string{"-b", "4000,5000", "-d", "6000,7000", "-k", "eth0,eth1", "-x", "2001:db8::/32", "-i", "2001:db8::/32"}, gid: "1,2", uid: "3,4", ipv6: true},
	{name: "ipv6-outbound-ports", args: []string{"-b", "", "-q", "32000,31000"}, ipv6: true},
	{name: "empty"},
	{name: "kube-virt-interfaces", args: []string{"-k", "eth1,eth2", "-i", "*"}},
	{name: "ipnets", args: []string{"-i", "10.0.0.0/8"}},
	{name: "ipnets-with-kube-virt-interfaces", args: []string{"-k", "eth1,eth2", "-i", "10.0.0.0/8"}},
	{name: "inbound-ports-include", args: []string{"-b", "32000,31000"}},
	{name: "inbound-ports-wildcard", args: []string{"-b", "*"}},
	{name: "inbound-ports-tproxy", args: []string{"-b", "32000,31000", "-m", "TPROXY"}},
	{name: "inbound-ports-wildcard-tproxy", args: []string{"-b", "*", "-m", "TPROXY"}},
	{name: "inbound-ports-empty-tproxy", args: []string{"-b", "", "-m", "TPROXY"}, nftOnly: true},
	{name: "dns-uid-gid", args: []string{"--redirect-dns"}, dns: []string{"127.0.0.53", "::127.0.0.53"}, gid: "1,2", uid: "3,4", ipv6: true},
	{name: "ipv6-dns-uid-gid", args: []string{"--redirect-dns"}, gid: "1,2", uid: "3,4", ipv6: true},
	{name: "outbound-owner-groups", env: []string{"ISTIO_OUTBOUND_OWNER_GROUPS=java,202"}},
	{name: "outbound-owner-groups-exclude", env: []string{"ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE=888,ftp"}},
	{name: "ipv6-dns-outbound-owner-groups", args: []string{"--redirect-dns"}, env: []string{"ISTIO_OUTBOUND_OWNER_GROUPS=java,202"}, ipv6: true},
	{name: "ipv6-dns-outbound-owner-groups-exclude", args: []string{"--redirect-dns"}, env: []string{"ISTIO_OUTBOUND_OWNER_GROUPS_EXCLUDE=888,ftp"}, ipv6: true},
	{name: "outbound-ports-include", args: []string{"-q", "32000,31000"}},
	{name: "loopback-outbound-iprange", args: []string{"-i", "127.1.2.3/32", "--redirect-dns"}, gid: "1,2", uid: "3,4", dns: []string{"127.0.0.53"}},
	{name: "basic-exclude-nic", args: []string{"-c", "not-istio-nic"}},
	{name: "drop-invalid", args: []string{"--drop-invalid"}},
	{name: "host-ipv4-loopback-cidr", env: []string{"ISTIO_OUTBOUND_IPV4_LOOPBACK_CIDR=127.0.0.1/8"}},
}

func (c captureCase) flags() []string {
	uid, gid := c.uid, c.gid
	if uid == "" {
		uid = "1337"
	}
	if gid == "" {
		gid = "1337"
	}
	return append([]string{"-u", uid, "-g", gid}, c.args...)
}

// pod is a throwaway network namespace set up as the pod of a case: lo up,
// one interface (a veth end) whose address is IPv6 when the case has IPv6 (istio turns
// IPv6 on from the pod's first address), and /etc/netns/NAME/ files that
// `ip netns exec` mounts over /etc: the case's resolv.conf, and a group
// database with the groups the owner-group cases name (java 1000, ftp
// 21), as in the pod's container.
type pod struct {
	h  *harness.H
	ns *harness.NS
}

func newPod(h *harness.H, c captureCase) *pod {
	t := h.T
	n := h.NewNS("istio")
	p := &pod{h: h, ns: n}
	addr := "198.18.0.2/24"
	if c.ipv6 {
		addr = "fd42:6d77::2/64"
	}
	p.mustRun("ip", "link", "add", "pod0", "type", "veth", "peer", "name", "pod0p")
	p.mustRun("ip", "addr", "add", addr, "dev", "pod0", "nodad")
	p.mustRun("ip", "link", "set", "pod0", "up")
	p.mustRun("ip", "link", "set", "lo", "up")

	etc := filepath.Join("/etc/netns", n.Name)
	if err := os.MkdirAll(etc, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(etc) })
	var resolv strings.Builder
	for _, s := range c.dns {
		fmt.Fprintf(&resolv, "nameserver %s\n", s)
	}
	group, err := os.ReadFile("/etc/group")
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []string{"java:x:1000:", "ftp:x:21:"} {
		if !regexp.MustCompile(`(?m)^` + strings.SplitN(g, ":", 2)[0] + `:`).Match(group) {
			group = append(group, []byte(g+"\n")...)
		}
	}
	for name, data := range map[string][]byte{"resolv.conf": []byte(resolv.String()), "group": group} {
		if err := os.WriteFile(filepath.Join(etc, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// run runs a command in the pod (ip netns exec) with stdin and extra
// environment.
func (p *pod) run(stdin string, env []string, name string, args ...string) (string, error) {
	cmd := exec.Command("ip", append([]string{"netns", "exec", p.ns.Name, name}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("%s %q: %v: %s", name, args, err, errb.String())
	}
	return out.String(), nil
}

func (p *pod) mustRun(name string, args ...string) string {
	p.h.T.Helper()
	out, err := p.run("", nil, name, args...)
	if err != nil {
		p.h.T.Fatal(err)
	}
	return out
}

// backend is a firewall backend the comparison runs on.
type backend struct {
	name    string // iptables-init's --iptables-backend
	variant string // iptables tool suffix ("" for nftables)
}

var backends = []backend{{"nft", "nft"}, {"legacy", "legacy"}, {"nftables", ""}}

func (b backend) tool(v6 bool, what string) string {
	t := "iptables"
	if v6 {
		t = "ip6tables"
	}
	return t + "-" + b.variant + "-" + what
}

var nftCounters = regexp.MustCompile(`counter packets \d+ bytes \d+`)

// tproxyDrop matches meshwire's drop after a tproxy rule (see
// normalizeNft).
var tproxyDrop = regexp.MustCompile(`^(\s*)(.*) drop$`)

// normalizeNft keeps what `nft list ruleset` prints of the rules: no
// comments, no counter values. With meshwireDrops, it removes the one
// deliberate difference of meshwire's nftables rules (a drop after each
// tproxy rule, docs/reference-differences.md) and counts them.
func normalizeNft(list string, meshwireDrops bool) (string, int) {
	var out []string
	drops := 0
	for _, line := range strings.Split(list, "\n") {
		t := strings.TrimSpace(line)
		if t == "" || strings.HasPrefix(t, "comment ") {
			continue
		}
		line = nftCounters.ReplaceAllString(line, "counter")
		if meshwireDrops && len(out) > 0 && strings.Contains(out[len(out)-1], " tproxy ") {
			if m := tproxyDrop.FindStringSubmatch(line); m != nil {
				prev := strings.TrimSpace(out[len(out)-1])
				if strings.HasPrefix(prev, strings.TrimSuffix(m[2], " counter")+" tproxy ") {
					drops++
					continue
				}
			}
		}
		out = append(out, line)
	}
	return strings.Join(out, "\n"), drops
}

// dryRunParts splits iptables-init --dry-run output into its
// iptables-restore payloads (by family) and its nft script.
func dryRunParts(out string) (v4, v6, nft string) {
	var cur *strings.Builder
	var b4, b6, bn strings.Builder
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "# ") {
			switch {
			case strings.HasPrefix(line, "# ip6tables-") && strings.HasSuffix(line, "-restore --noflush"):
				cur = &b6
			case strings.HasPrefix(line, "# iptables-") && strings.HasSuffix(line, "-restore --noflush"):
				cur = &b4
			case line == "# nft -f -":
				cur = &bn
			}
			continue
		}
		if cur != nil {
			cur.WriteString(line + "\n")
		}
	}
	return b4.String(), b6.String(), bn.String()
}

func diffLines(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var b strings.Builder
	for _, l := range w {
		if !slices.Contains(g, l) {
			fmt.Fprintf(&b, "- %s\n", l)
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			fmt.Fprintf(&b, "+ %s\n", l)
		}
	}
	if b.Len() == 0 {
		return "(same lines, other order)\n"
	}
	return b.String()
}

// TestIstioCaptureGoldens: for every case of istio-iptables' and
// istio-nftables' capture tests, Istio's golden rule set and meshwire's,
// each loaded into a throwaway namespace and read back by the same tool,
// are the same, on iptables-nft, iptables-legacy and native nftables:
// meshwire's real install and its --dry-run output alike. The only
// difference allowed is the comments meshwire puts on its rules (and, in
// nftables, the drop after each tproxy rule, counted).
func TestIstioCaptureGoldens(t *testing.T) {
	h := harness.New(t)
	bin := filepath.Join(h.BinDir, "iptables-init")
	for _, b := range backends {
		for _, c := range captureCases {
			if c.nftOnly && b.variant != "" {
				continue
			}
			t.Run(b.name+"/"+c.name, func(t *testing.T) {
				h := harness.New(t)
				if b.variant == "" {
					compareNft(t, h, bin, c)
				} else {
					compareIPTables(t, h, bin, b, c)
				}
			})
		}
	}
}

func compareIPTables(t *testing.T, h *harness.H, bin string, b backend, c captureCase) {
	golden, err := File("tools/istio-iptables/pkg/capture/testdata/" + c.name + ".golden")
	if err != nil {
		t.Fatal(err)
	}
	gv4, gv6 := SplitIPTablesGolden(string(golden))
	if gv4 == "" || (gv6 != "") != c.ipv6 {
		t.Fatalf("golden %s: IPv4 %d bytes, IPv6 %d bytes; the case has IPv6 %v", c.name, len(gv4), len(gv6), c.ipv6)
	}
	save := func(p *pod, v6 bool) string {
		return NormalizeSave(p.mustRun(b.tool(v6, "save")))
	}
	load := func(p *pod, v6 bool, payload string) {
		t.Helper()
		if payload == "" {
			return
		}
		if _, err := p.run(payload, nil, b.tool(v6, "restore"), "--noflush"); err != nil {
			t.Fatalf("load: %v\n%s", err, payload)
		}
	}
	istio := newPod(h, c)
	load(istio, false, gv4)
	load(istio, true, gv6)
	want := [2]string{save(istio, false), save(istio, true)}

	flags := append(c.flags(), "--iptables-backend", b.name)
	real := newPod(h, c)
	if out, err := real.run("", c.env, bin, flags...); err != nil {
		t.Fatalf("iptables-init %q: %v\n%s", flags, err, out)
	}
	got := [2]string{save(real, false), save(real, true)}

	dry := newPod(h, c)
	out, err := dry.run("", c.env, bin, append(flags, "--dry-run")...)
	if err != nil {
		t.Fatalf("iptables-init --dry-run %q: %v\n%s", flags, err, out)
	}
	if s := save(dry, false) + save(dry, true); s != "" {
		t.Fatalf("--dry-run changed the namespace:\n%s", s)
	}
	dv4, dv6, _ := dryRunParts(out)
	load(dry, false, dv4)
	load(dry, true, dv6)
	gotDry := [2]string{save(dry, false), save(dry, true)}

	for i, fam := range []string{"IPv4", "IPv6"} {
		if want[i] == "" && i == 0 {
			t.Fatalf("istio's %s rules read back empty", fam)
		}
		if got[i] != want[i] {
			t.Errorf("%s: installed rules differ from istio's golden:\n%s--- istio\n%s\n--- meshwire\n%s", fam, diffLines(want[i], got[i]), want[i], got[i])
		}
		if gotDry[i] != want[i] {
			t.Errorf("%s: --dry-run rules differ from istio's golden:\n%s--- meshwire --dry-run\n%s\n--- dry-run output\n%s", fam, diffLines(want[i], gotDry[i]), gotDry[i], out)
		}
	}
}

func compareNft(t *testing.T, h *harness.H, bin string, c captureCase) {
	golden, err := File("tools/istio-nftables/pkg/capture/testdata/" + c.name + ".golden")
	if err != nil {
		t.Fatal(err)
	}
	list := func(p *pod) string { return p.mustRun("nft", "list", "ruleset") }
	istio := newPod(h, c)
	if out, err := istio.run(string(golden), nil, "nft", "-f", "-"); err != nil {
		t.Fatalf("load golden: %v\n%s", err, out)
	}
	want, _ := normalizeNft(list(istio), false)
	if want == "" {
		t.Fatal("istio's rules read back empty")
	}
	flags := append(c.flags(), "--native-nftables")
	// TPROXY rules exist with -m TPROXY and inbound ports (-b "" has none).
	tproxy := slices.Contains(c.args, "TPROXY") && !slices.Contains(c.args, "")

	real := newPod(h, c)
	if out, err := real.run("", c.env, bin, flags...); err != nil {
		t.Fatalf("iptables-init %q: %v\n%s", flags, err, out)
	}
	got, drops := normalizeNft(list(real), true)
	if got != want {
		t.Errorf("installed rules differ from istio's golden:\n%s--- istio\n%s\n--- meshwire\n%s", diffLines(want, got), want, got)
	}
	if tproxy != (drops > 0) {
		t.Errorf("%d drops after tproxy rules, TPROXY capture %v", drops, tproxy)
	}

	dry := newPod(h, c)
	out, err := dry.run("", c.env, bin, append(flags, "--dry-run")...)
	if err != nil {
		t.Fatalf("iptables-init --dry-run %q: %v\n%s", flags, err, out)
	}
	if s := list(dry); s != "" {
		t.Fatalf("--dry-run changed the namespace:\n%s", s)
	}
	_, _, script := dryRunParts(out)
	if _, err := dry.run(script, nil, "nft", "-f", "-"); err != nil {
		t.Fatalf("load --dry-run script: %v\n%s", err, out)
	}
	gotDry, _ := normalizeNft(list(dry), true)
	if gotDry != want {
		t.Errorf("--dry-run rules differ from istio's golden:\n%s--- meshwire --dry-run\n%s", diffLines(want, gotDry), gotDry)
	}
}
