package demo

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/ebpf/loader"
	"github.com/meshwire/meshwire/internal/cniruntime"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/proxylog"
)

// The mesh part of the demo: a third pod whose conflist chains the intercept
// plugin, with meshwire's test proxy (bin/test/proxy, built by `make build`)
// as its sidecar, running as the proxy uid.
const (
	demoMeshPod   = "mwdemo-mesh"
	demoProxyUID  = 1337
	demoMeshApp   = 8080
	demoProxyName = "proxy"
)

// findTestProxy looks for the test proxy next to the meshwire binary.
func findTestProxy() string {
	exe, err := os.Executable()
	if err != nil {
		return ""
	}
	p := filepath.Join(filepath.Dir(exe), "test", demoProxyName)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// meshConflist is the conflist with the intercept plugin appended, capturing
// every inbound port and every outbound destination (as a mesh pod would).
func meshConflist(conflist []byte) ([]byte, error) {
	return withPlugin(conflist, map[string]any{
		"type":                "intercept",
		"istio-service-cidr":  "*",
		"istio-inbound-ports": "*",
	})
}

// withPlugin is the conflist with one more plugin at the end of its chain.
func withPlugin(conflist []byte, plugin map[string]any) ([]byte, error) {
	var m map[string]any
	if err := json.Unmarshal(conflist, &m); err != nil {
		return nil, err
	}
	plugins, _ := m["plugins"].([]any)
	m["plugins"] = append(plugins, plugin)
	return json.Marshal(m)
}

// sidecar is the running test proxy and what it has logged.
type sidecar struct {
	name string // as the steps call its log: "proxy", "ztunnel"
	cmd  *exec.Cmd
	dir  string
	recs chan proxylog.Record
}

// startSidecar starts the test proxy as the mesh pod's sidecar: uid 1337,
// inside the pod's namespace.
func startSidecar(proxy, nsPath string) (*sidecar, error) {
	return startProxy(proxy, "proxy", nsPath, demoProxyUID, "-mode", "redirect", "-dns", "0")
}

// startProxy copies the proxy where the proxy uid can run it (a fresh
// world-readable directory: the build and state directories may be private
// to root) and starts it with args, as uid (0: root), from a thread inside
// the namespace nsPath ("": the host's), so the process lives there.
func startProxy(proxy, name, nsPath string, uid uint32, args ...string) (*sidecar, error) {
	data, err := os.ReadFile(proxy)
	if err != nil {
		return nil, err
	}
	workDir, err := os.MkdirTemp("", "meshwire-demo-"+name+"-")
	if err != nil {
		return nil, err
	}
	s := &sidecar{name: name, dir: workDir, recs: make(chan proxylog.Record, 64)}
	if err := os.Chmod(workDir, 0o755); err != nil {
		s.stop()
		return nil, err
	}
	bin := filepath.Join(workDir, demoProxyName)
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		s.stop()
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: unix.SIGKILL} // never outlive the demo
	if uid != 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uid, Gid: uid}
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		s.stop()
		return nil, err
	}
	start := cmd.Start
	if nsPath != "" {
		start = func() error { return netns.Enter(nsPath, cmd.Start) }
	}
	if err := start(); err != nil {
		s.stop()
		return nil, err
	}
	s.cmd = cmd
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var r proxylog.Record
			if json.Unmarshal(sc.Bytes(), &r) == nil {
				s.recs <- r
			}
		}
		close(s.recs)
	}()
	if r, err := s.next(5 * time.Second); err != nil || r.Event != "ready" {
		s.stop()
		if err == nil {
			err = fmt.Errorf("proxy said %s %s", r.Event, r.Err)
		}
		return nil, fmt.Errorf("test proxy did not start: %w", err)
	}
	return s, nil
}

func (s *sidecar) next(timeout time.Duration) (proxylog.Record, error) {
	select {
	case r, ok := <-s.recs:
		if !ok {
			return r, io.EOF
		}
		return r, nil
	case <-time.After(timeout):
		return proxylog.Record{}, fmt.Errorf("no record within %s", timeout)
	}
}

// conn waits for the proxy's record of a connection on the given listener.
func (s *sidecar) conn(listener string) (proxylog.Record, error) {
	return s.wait(listener+" connection", func(r proxylog.Record) bool { return r.Event == "conn" && r.Listener == listener })
}

// wait waits for a record that matches, skipping the others.
func (s *sidecar) wait(what string, match func(proxylog.Record) bool) (proxylog.Record, error) {
	for {
		r, err := s.next(3 * time.Second)
		if err != nil {
			return r, fmt.Errorf("the %s logged no %s: %w", s.name, what, err)
		}
		if match(r) {
			return r, nil
		}
	}
}

func (s *sidecar) stop() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
	_ = os.RemoveAll(s.dir)
}

// proxiedCall serves hello as name on addr's port in the namespace
// serverNS and shows, as the step label, a call from clientNS to addr that
// the sidecar's listener ("outbound" or "inbound") relays; check, when
// set, also judges the proxy's record and the reply. It returns the
// server for the caller to close (nil when it could not start; the step
// then shows the failed call).
func (d *demo) proxiedCall(side *sidecar, listener, label, clientNS, serverNS, name, addr string, port int, check func(proxylog.Record, string) error) io.Closer {
	var closer io.Closer
	if srv, err := serveHello(serverNS, fmt.Sprintf(":%d", port), name); err == nil {
		closer = srv
	}
	d.step(label, func() (string, error) {
		reply, err := fetchHello(clientNS, addr)
		if err != nil {
			return "", err
		}
		r, err := side.conn(listener)
		if err != nil {
			return "", err
		}
		if check != nil {
			if err := check(r, reply); err != nil {
				return "", err
			}
		}
		return fmt.Sprintf("%s log: %s from %s, original destination %s; reply %q", side.name, listener, r.Src, r.OrigDst, reply), nil
	})
	return closer
}

// meshSteps wires the mesh pod, starts its sidecar, and shows an outbound
// call of the app to pod b and an inbound call from pod a to the app, both
// through the proxy, with the original destinations the proxy read.
func (d *demo) meshSteps(conflist []byte, a, b *cniruntime.Record) {
	proxy, mesh, ok := d.proxyAndConflist("mesh pod", "", "mesh conflist", conflist, meshConflist)
	if !ok {
		return
	}
	rec := d.wire(demoMeshPod, fmt.Sprintf("%s wired with the intercept plugin chained", demoMeshPod), mesh, nil)
	if rec == nil {
		return
	}
	if detach := d.fastpathOn(); detach != nil {
		defer detach()
	}
	if forget := d.feedProxy(rec.NetNS); forget != nil {
		defer forget()
	}
	side, err := startSidecar(proxy, rec.NetNS)
	if err != nil {
		d.step("start the sidecar", func() (string, error) { return "", err })
		return
	}
	defer side.stop()
	fmt.Fprintf(d.out, "        sidecar: meshwire's test proxy as uid %d in %s (outbound :15001, inbound :15006)\n", demoProxyUID, demoMeshPod)

	if dst := podAddress(d.rt, b, true); dst != nil {
		addr := net.JoinHostPort(dst.String(), strconv.Itoa(demoPodPort))
		if srv := d.proxiedCall(side, "outbound", fmt.Sprintf("%s app -> %s goes through the sidecar", demoMeshPod, addr),
			rec.NetNS, b.NetNS, b.Name, addr, demoPodPort, nil); srv != nil {
			defer srv.Close()
		}
	}
	if dst := podAddress(d.rt, rec, true); dst != nil {
		addr := net.JoinHostPort(dst.String(), strconv.Itoa(demoMeshApp))
		if app := d.proxiedCall(side, "inbound", fmt.Sprintf("%s -> %s app at %s goes through the sidecar", a.Name, demoMeshPod, addr),
			a.NetNS, rec.NetNS, demoMeshPod+" app", addr, demoMeshApp, nil); app != nil {
			defer app.Close()
		}
	}
	d.fastpathCounters()
	d.step(fmt.Sprintf("%s: CNI CHECK passes (interception rules in place)", demoMeshPod), func() (string, error) {
		return "", d.rt.Check(d.ctx, demoMeshPod)
	})
}

// proxyAndConflist finds the test proxy (a "skip" line for pod when it is
// not built; role says what it stands in for) and builds the pod's
// conflist from the demo's (a failed step named what when it cannot).
func (d *demo) proxyAndConflist(pod, role, what string, conflist []byte, build func([]byte) ([]byte, error)) (proxy string, list []byte, ok bool) {
	if proxy = findTestProxy(); proxy == "" {
		fmt.Fprintf(d.out, "  skip  %s: the test proxy (bin/test/proxy)%s is not built; run `make build`\n", pod, role)
		return "", nil, false
	}
	list, err := build(conflist)
	if err != nil {
		d.step(what, func() (string, error) { return "", err })
		return "", nil, false
	}
	return proxy, list, true
}

// wire adds pod name with conflist list (and the runtime's capability
// args and CNI_ARGS) as the step labeled label, which shows its
// addresses; nil when it failed.
func (d *demo) wire(name, label string, list []byte, caps map[string]any, args ...[2]string) *cniruntime.Record {
	var rec *cniruntime.Record
	d.step(label, func() (string, error) {
		r, _, err := d.rt.Add(d.ctx, name, list, "eth0", caps, args...)
		rec = r
		if err != nil {
			return "", err
		}
		return strings.Join(ipStrings(podIPs(d.rt, r)), ", "), nil
	})
	return rec
}

func ipStrings(ips []*current.IPConfig) []string {
	var out []string
	for _, ip := range ips {
		out = append(out, ip.Address.String())
	}
	return out
}

// fastpathOn attaches the eBPF fast path for the mesh pod unless it is
// attached already, and returns how to detach it again (nil when the demo
// did not attach it). A kernel without support is reported and skipped:
// the pod works through the rules alone.
func (d *demo) fastpathOn() func() {
	cfg := fastpath.Defaults()
	cfg.ProxyUID = demoProxyUID
	res, err := fastpath.Attach(cfg)
	if err != nil {
		fmt.Fprintf(d.out, "  skip  eBPF fast path: %v\n", err)
		return nil
	}
	if res == loader.AlreadyAttached {
		fmt.Fprintf(d.out, "        eBPF fast path: already attached, used as it is\n")
		return nil
	}
	fmt.Fprintf(d.out, "        eBPF fast path: attached (app <-> sidecar bytes skip TCP/IP and netfilter)\n")
	return func() {
		_, _ = fastpath.Detach(cfg.PinDir)
	}
}

// feedProxy gives the mesh pod the fast-path policy the intercept plugin
// gives an Istio pod: its proxy may be fed too (the test proxy reads with
// read(2), never splice), so both directions are carried. It returns how
// to take the policy back (nil when the fast path is not attached).
func (d *demo) feedProxy(nsPath string) func() {
	var set bool
	if err := netns.Enter(nsPath, func() (err error) {
		set, err = podpolicy.Set("", podpolicy.Policy{IntoProxy: true})
		return err
	}); err != nil {
		fmt.Fprintf(d.out, "  skip  eBPF fast path toward the sidecar: %v\n", err)
		return nil
	}
	if !set {
		return nil
	}
	fmt.Fprintf(d.out, "        eBPF fast path: both directions for %s (its policy lets the proxy be fed, as for Istio's Envoy)\n", demoMeshPod)
	return func() { _ = netns.Enter(nsPath, func() error { return podpolicy.Forget("") }) }
}

// fastpathCounters shows what the fast path carried for the mesh pod.
func (d *demo) fastpathCounters() {
	st, err := fastpath.ReadStatus(fastpath.DefaultPinDir)
	if err != nil || !st.Attached {
		return
	}
	d.step(fmt.Sprintf("%s: the eBPF fast path carried sidecar <-> app bytes", demoMeshPod), func() (string, error) {
		if st.RedirectedMessages == 0 {
			return "", fmt.Errorf("nothing redirected (%d sockets, %d pairs)", st.Sockets, st.Pairs)
		}
		return fmt.Sprintf("%d connections paired, %d messages (%d bytes) handed over, %d on TCP (%d kept from the proxy)", st.Pairs, st.RedirectedMessages, st.RedirectedBytes, st.Fallbacks, st.KeptForProxy), nil
	})
}
