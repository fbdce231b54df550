//go:build kernel

package e2e

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/meshwire/meshwire/internal/installer"
	"github.com/meshwire/meshwire/test/cri"
	"github.com/meshwire/meshwire/test/harness"
	"github.com/meshwire/meshwire/test/istio"
)

// Addresses and ports of the CRI test: pods in 198.18.112.0/24 behind a
// bridge mwtc<random>; the outside client behind a veth pair, host end
// 198.18.113.1/30, client end .2; host ports 32080 (plain pod) and 32081
// (meshed pod).
const (
	criSubnet      = "198.18.112.0/24"
	criHost4       = "198.18.113.1"
	criClient4     = "198.18.113.2"
	criPlainPort   = 32080
	criMeshPort    = 32081
	criExcluded    = 15021 // the sidecar's readiness port: never captured, as with istio-cni
	criIngressBits = 10_000_000
	criEgressBits  = 20_000_000
)

// TestCRIPerPodInterception runs meshwire's plugins through containerd's CRI
// plugin exactly as kubelet drives it (RunPodSandbox with annotations and
// port mappings, containers, ExecSync, StopPodSandbox, RemovePodSandbox):
// bridge + host-local, and portmap, bandwidth and intercept chained as
// `meshwire install --chain` writes them into the node's config. A pod
// annotated as Istio's injector annotates one gets istio-cni's rules (its
// golden "basic", compared after both are read back by iptables-save) and
// its traffic really goes through its "sidecar" (a busybox httpd as uid
// 1337 on the proxy's ports) but for the readiness port; a plain pod gets
// none and serves directly; host ports reach both; the bandwidth
// annotations shape the plain pod's veth; removing the pods leaves nothing
// on the host.
func TestCRIPerPodInterception(t *testing.T) {
	h := harness.New(t)
	nodeBaseline(t)
	h.CheckNoLeaks()
	br := "mwtc" + harness.RandomID()[:6]
	// The bridge outlives its pods (as cni0 does): removed after
	// containerd's cleanup, before the leak check.
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(br); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	outside := h.NewOutside("crio", "mwtco"+harness.RandomID()[:6], []string{criHost4 + "/30"}, []string{criClient4 + "/30"})

	// The node's own config, then meshwire's plugins chained into it by
	// the installer's code.
	chained, err := installer.Chain([]byte(fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "mwt-cri",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isDefaultGateway": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "dataDir": %q}}
  ]
}`, br, criSubnet, t.TempDir())))
	if err != nil || !slices.Equal(chained.Added, []string{"portmap", "bandwidth", "intercept"}) {
		t.Fatalf("chain: %v (added %v)", err, chained.Added)
	}
	start := time.Now()
	c := cri.Start(t, cri.Config{BinDir: h.BinDir, ConfList: string(chained.Out)})
	t.Logf("containerd with CRI ready in %s (%s)", time.Since(start).Round(time.Millisecond), c.Dir)

	mesh := c.RunPod(cri.PodSpec{
		Name: "reviews", Namespace: "shop",
		Labels: map[string]string{"app": "reviews"},
		Annotations: map[string]string{
			"sidecar.istio.io/status": `{"initContainers":["istio-validation"],"containers":["istio-proxy"],"volumes":["workload-socket","credential-socket","workload-certs","istio-envoy","istio-data","istio-podinfo","istio-token","istiod-ca-cert"],"imagePullSecrets":null,"revision":"default"}`,
		},
		PortMappings: []*runtimeapi.PortMapping{{Protocol: runtimeapi.Protocol_TCP, ContainerPort: 80, HostPort: criMeshPort}},
	})
	plain := c.RunPod(cri.PodSpec{
		Name: "ratings", Namespace: "shop",
		Labels: map[string]string{"app": "ratings"},
		Annotations: map[string]string{
			"kubernetes.io/ingress-bandwidth": "10M",
			"kubernetes.io/egress-bandwidth":  "20M",
		},
		PortMappings: []*runtimeapi.PortMapping{{Protocol: runtimeapi.Protocol_TCP, ContainerPort: 80, HostPort: criPlainPort}},
	})
	meshIP, plainIP := criPodIP(t, mesh), criPodIP(t, plain)
	meshNS, plainNS := mesh.NetNS(), plain.NetNS()
	meshVeth, plainVeth := criHostEnd(t, meshNS), criHostEnd(t, plainNS)
	t.Logf("pods up in %s: reviews %s (%s, %s), ratings %s (%s, %s)", time.Since(start).Round(time.Millisecond),
		meshIP, meshNS, meshVeth, plainIP, plainNS, plainVeth)

	// The applications: busybox httpd answering with the pod's name, on
	// port 80 and on the excluded port; the meshed pod's sidecar as the
	// proxy user on the proxy's inbound and outbound ports.
	serve := func(dir, body string, ports ...int) string {
		s := fmt.Sprintf("mkdir -p %s && echo %s > %s/index.html", dir, body, dir)
		for i, p := range ports {
			if i == len(ports)-1 {
				s += fmt.Sprintf(" && exec httpd -f -p %d -h %s", p, dir)
			} else {
				s += fmt.Sprintf(" && httpd -p %d -h %s", p, dir)
			}
		}
		return s
	}
	meshApp := mesh.StartContainer(cri.ContainerSpec{Name: "app", Command: []string{"/bin/sh", "-c", serve("/tmp/www", "app-reviews", criExcluded, 80)}})
	sidecar := mesh.StartContainer(cri.ContainerSpec{
		Name: "istio-proxy", RunAsUser: cri.Int64(1337), RunAsGroup: cri.Int64(1337),
		Command: []string{"/bin/sh", "-c", serve("/tmp/out", "sidecar-outbound", 15001) + " & " + serve("/tmp/in", "sidecar-inbound", 15006)},
	})
	plainApp := plain.StartContainer(cri.ContainerSpec{Name: "app", Command: []string{"/bin/sh", "-c", serve("/tmp/www", "app-ratings", 80)}})

	t.Run("rules", func(t *testing.T) {
		// istio-cni's rules for a pod with no traffic annotation: its
		// golden "basic", loaded into a scratch namespace, read back as
		// the pod's are.
		golden, err := istio.File("cni/pkg/plugin/testdata/basic.txt.golden")
		if err != nil {
			t.Fatal(err)
		}
		v4, _ := istio.SplitIPTablesGolden(string(golden))
		scratch := h.NewNS("cri-istio")
		if out, err := scratch.ExecStdin(v4, "iptables-nft-restore", "--noflush"); err != nil {
			t.Fatalf("load istio-cni's golden: %v\n%s", err, out)
		}
		want := istio.NormalizeSave(criSave(t, scratch.Path))
		if got := istio.NormalizeSave(criSave(t, meshNS)); got != want {
			t.Errorf("the annotated pod's rules are not istio-cni's:\n--- istio-cni\n%s\n--- pod\n%s", want, got)
		}
		if rules := criRules(t, plainNS); strings.Contains(rules, "ISTIO") || strings.Contains(rules, "meshwire") {
			t.Errorf("the plain pod's namespace has interception rules:\n%s", rules)
		}
	})

	inHost := func(f func() error) error { return f() }
	fromOutside := func(f func() error) error { return outside.Do(f) }
	t.Run("inbound", func(t *testing.T) {
		// Captured by the meshed pod's sidecar, except the excluded port.
		criWantHTTP(t, inHost, meshIP, 80, "sidecar-inbound")
		criWantHTTP(t, inHost, meshIP, criExcluded, "app-reviews")
		// The plain pod serves directly.
		criWantHTTP(t, inHost, plainIP, 80, "app-ratings")
	})

	t.Run("outbound", func(t *testing.T) {
		// The app's connections go to the sidecar's outbound port...
		if got := criExecGet(t, meshApp, plainIP, 80); got != "sidecar-outbound" {
			t.Errorf("GET %s:80 from the meshed app: %q, want the sidecar's outbound listener", plainIP, got)
		}
		// ...the sidecar's own (uid 1337) go out as they are...
		if got := criExecGet(t, sidecar, plainIP, 80); got != "app-ratings" {
			t.Errorf("GET %s:80 from the sidecar: %q, want the plain pod", plainIP, got)
		}
		// ...and the plain pod's too.
		if got := criExecGet(t, plainApp, meshIP, criExcluded); got != "app-reviews" {
			t.Errorf("GET %s:%d from the plain pod: %q, want the meshed pod's app", meshIP, criExcluded, got)
		}
	})

	t.Run("portmap", func(t *testing.T) {
		criWantHTTP(t, fromOutside, criHost4, criPlainPort, "app-ratings")
		// DNATed traffic enters the meshed pod through its sidecar.
		criWantHTTP(t, fromOutside, criHost4, criMeshPort, "sidecar-inbound")
	})

	t.Run("bandwidth", func(t *testing.T) {
		tbf := bandwidthRootTbf(t, plainVeth)
		if tbf == nil {
			t.Fatalf("no tbf at the root of %s (kubernetes.io/ingress-bandwidth)", plainVeth)
		}
		if tbf.Rate != criIngressBits/8 {
			t.Errorf("tbf on %s: rate %d bytes/s, want %d", plainVeth, tbf.Rate, criIngressBits/8)
		}
		ifb := bandwidthIfbOf(t, plainVeth)
		if ifb == "" {
			t.Fatalf("%s's ingress does not redirect to an ifb (kubernetes.io/egress-bandwidth)", plainVeth)
		}
		if tbf := bandwidthRootTbf(t, ifb); tbf == nil || tbf.Rate != criEgressBits/8 {
			t.Errorf("tbf on %s: %+v, want rate %d bytes/s", ifb, tbf, criEgressBits/8)
		}
		if tbf := bandwidthRootTbf(t, meshVeth); tbf != nil {
			t.Errorf("the meshed pod (no bandwidth annotation) is shaped: %+v", tbf)
		}
	})
	if t.Failed() {
		return
	}

	// Removing the pods (containerd runs DEL) leaves nothing behind: no
	// veth, ifb, namespace, host port or rule of theirs. (The leak check
	// at cleanup covers the whole host once the bridge is gone.)
	ifb := bandwidthIfbOf(t, plainVeth)
	for _, p := range []*cri.Pod{mesh, plain} {
		if err := p.Remove(); err != nil {
			t.Fatalf("remove pod: %v", err)
		}
	}
	t.Logf("pods removed after %s", time.Since(start).Round(time.Millisecond))
	for _, link := range []string{meshVeth, plainVeth, ifb} {
		if _, err := netlink.LinkByName(link); err == nil {
			t.Errorf("%s still exists after the pods were removed", link)
		}
	}
	for _, p := range []string{meshNS, plainNS} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("network namespace %s still exists after the pods were removed", p)
		}
	}
	for _, tool := range []string{"iptables-save", "iptables-legacy-save", "nft list ruleset"} {
		f := strings.Fields(tool)
		out, err := exec.Command(f[0], f[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", tool, err, out)
		}
		for _, s := range []string{meshIP, plainIP, fmt.Sprint(criPlainPort), fmt.Sprint(criMeshPort)} {
			if strings.Contains(string(out), s) {
				t.Errorf("%s still mentions %s after the pods were removed:\n%s", tool, s, out)
			}
		}
	}
}

// criPodIP is the pod's IP as CRI reports it, checked to be in the subnet.
func criPodIP(t *testing.T, p *cri.Pod) string {
	t.Helper()
	ip := p.IP()
	a, err := netip.ParseAddr(ip)
	if err != nil || !netip.MustParsePrefix(criSubnet).Contains(a) {
		t.Fatalf("pod %s: IP %q not in %s", p.Config.Metadata.Name, ip, criSubnet)
	}
	return ip
}

// criHostEnd finds the host end of eth0 in the namespace at path from the
// veth's peer index.
func criHostEnd(t *testing.T, path string) string {
	t.Helper()
	var idx int
	if err := ns.WithNetNSPath(path, func(ns.NetNS) error {
		l, err := netlink.LinkByName("eth0")
		if err == nil {
			idx = l.Attrs().ParentIndex
		}
		return err
	}); err != nil {
		t.Fatalf("eth0 in %s: %v", path, err)
	}
	peer, err := netlink.LinkByIndex(idx)
	if err != nil {
		t.Fatalf("host end of eth0 in %s: %v", path, err)
	}
	return peer.Attrs().Name
}

// criRules returns the firewall state of a pod's namespace in every
// backend: iptables (nft and legacy, both families) and nftables.
// criSave is iptables-nft-save in the namespace at path.
func criSave(t *testing.T, path string) string {
	t.Helper()
	out, err := exec.Command("nsenter", "--net="+path, "iptables-nft-save").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables-nft-save in %s: %v\n%s", path, err, out)
	}
	return string(out)
}

func criRules(t *testing.T, path string) string {
	t.Helper()
	var b strings.Builder
	for _, tool := range []string{"iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save", "ip6tables-legacy-save", "nft list ruleset"} {
		args := append([]string{"--net=" + path}, strings.Fields(tool)...)
		out, err := exec.Command("nsenter", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s in %s: %v\n%s", tool, path, err, out)
		}
		fmt.Fprintf(&b, "== %s\n%s", tool, out)
	}
	return b.String()
}

// criWantHTTP gets / from addr:port (the connection made inside the
// namespace do enters), retrying while the servers start, and wants body.
func criWantHTTP(t *testing.T, do func(func() error) error, addr string, port int, body string) {
	t.Helper()
	dst := net.JoinHostPort(addr, fmt.Sprint(port))
	var got string
	var err error
	for deadline := time.Now().Add(15 * time.Second); ; {
		got, err = criGet(do, dst)
		if err == nil && got == body {
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Errorf("GET http://%s/: %q, %v; want %q", dst, got, err, body)
}

// criGet is a minimal HTTP/1.0 GET returning the body, trimmed.
func criGet(do func(func() error) error, dst string) (string, error) {
	var conn net.Conn
	if err := do(func() error {
		var err error
		conn, err = net.DialTimeout("tcp", dst, 2*time.Second)
		return err
	}); err != nil {
		return "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET / HTTP/1.0\r\nHost: %s\r\n\r\n", dst); err != nil {
		return "", err
	}
	r := bufio.NewReader(conn)
	status, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if !strings.Contains(status, " 200 ") {
		return "", fmt.Errorf("status %q", strings.TrimSpace(status))
	}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return "", err
		}
		if strings.TrimSpace(line) == "" {
			break
		}
	}
	body, err := io.ReadAll(r)
	return strings.TrimSpace(string(body)), err
}

// criExecGet gets / from addr:port inside the container (CRI ExecSync;
// busybox nc, as Debian's busybox-static wget crashes), retrying while the
// servers start, and returns the body ("" and the last error logged when it
// never answered).
func criExecGet(t *testing.T, ct *cri.Container, addr string, port int) string {
	t.Helper()
	script := fmt.Sprintf(`printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 %s %d`, addr, port)
	var last string
	for deadline := time.Now().Add(15 * time.Second); ; {
		stdout, stderr, code, err := ct.Exec(10*time.Second, "/bin/sh", "-c", script)
		head, body, ok := strings.Cut(stdout, "\r\n\r\n")
		if err == nil && code == 0 && ok && strings.Contains(head, " 200 ") {
			return strings.TrimSpace(body)
		}
		last = fmt.Sprintf("exit %d, %v: %q %q", code, err, stdout, stderr)
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("%s: %s", script, last)
	return ""
}
