package demo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/cniruntime"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/logging"
	"github.com/meshwire/meshwire/internal/nodeagent"
	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/poll"
	"github.com/meshwire/meshwire/internal/proxylog"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// The ambient part of the demo (docs/ambient.md): the node agent's ambient
// mode in the demo's own process, without an API server (pods enrolled by
// their annotation istio.io/dataplane-mode=ambient), the test proxy as
// ztunnel's stand-in, and a fourth pod that the intercept plugin enrolls.
const (
	demoAmbientPod = "mwdemo-ambient"
	demoAmbientNS  = "demo" // the pod's Kubernetes namespace
	demoAmbientUID = "uid-mwdemo-ambient"
)

// nodeState is where the demo's pods' records and ambient mode's socket
// are, laid out as on a node (package nodelayout): in the demo's state
// dir, so that the next demo's agent finds what a demo killed hard left
// enrolled, and forgets it.
func nodeState(rt *cniruntime.Runtime) string { return filepath.Join(rt.StateDir, "node") }

func ambientOptions(rt *cniruntime.Runtime) nodeagent.AmbientOptions {
	return nodeagent.AmbientOptions{StateDir: nodeState(rt), ZtunnelSocket: filepath.Join(nodeState(rt), "ztunnel.sock")}
}

// stateEnv points the intercept plugin, which the runtime runs with the
// demo's environment, at the demo's records and agent: for every ADD and
// DEL of the demo, leftovers' too (never at the node's own).
func stateEnv(rt *cniruntime.Runtime) {
	_ = os.Setenv(nodelayout.EnvNodeStateDir, nodeState(rt))
}

// ambientConflist is the conflist with the intercept plugin appended, which
// the runtime gives the pod's annotations.
func ambientConflist(conflist []byte) ([]byte, error) {
	return withPlugin(conflist, map[string]any{
		"type":         "intercept",
		"capabilities": map[string]bool{"io.kubernetes.cri.pod-annotations": true},
	})
}

// ambientSteps starts ambient mode and the ztunnel stand-in, wires the
// ambient pod, shows its traffic going through ztunnel both ways with the
// original destinations, the host's probe reaching its app uncaptured, and
// its DEL; then stops ambient mode, whose host rule and sets go with it.
func (d *demo) ambientSteps(conflist []byte, a, b *cniruntime.Record) {
	if d.ctx.Err() != nil {
		return
	}
	proxy, list, ok := d.proxyAndConflist("ambient pod", ", ztunnel's stand-in,", "ambient conflist", conflist, ambientConflist)
	if !ok {
		return
	}
	failed := d.failed
	// The agent's log (log/slog's default logger), kept while the part
	// runs.
	log := &logging.Buffer{}
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(slog.New(slog.NewTextHandler(log, nil)))
	defer func() {
		if d.failed > failed {
			fmt.Fprintf(d.errOut, "meshwire: the ambient agent's log:\n%s\n", log)
		}
	}()

	o := ambientOptions(d.rt)
	// Its own context: an interrupt must not stop the agent before the
	// pod's DEL has told it, or its host rule would stay.
	amb, err := nodeagent.StartAmbient(context.Background(), o, 200*time.Millisecond)
	if err != nil {
		d.step("start ambient mode", func() (string, error) { return "", err })
		return
	}
	backend := amb.Backend()
	defer func() {
		d.report("ambient mode stopped: the host's probe rule and probe sets removed", func() (string, error) {
			removed, err := amb.Stop()
			if err != nil {
				return "", err
			}
			if !removed {
				return "", errors.New("a pod is still enrolled: the host rule stays")
			}
			if err := ambientHostClean(backend); err != nil {
				return "", err
			}
			return fmt.Sprintf("no %s rule, no set left", backend), nil
		})
	}()
	fmt.Fprintf(d.out, "        node agent: ambient mode in the demo's process (%s rules; pods enrolled by their annotation %s=ambient)\n", backend, ambient.LabelDataplaneMode)

	zt, err := startProxy(proxy, "ztunnel", "", 0, "-zds", o.ZtunnelSocket, "-hbone", "0", "-dns", "0")
	if err != nil {
		d.step("start the ztunnel stand-in", func() (string, error) { return "", err })
		return
	}
	defer zt.stop()
	if err := poll.Until(10*time.Second, func() bool { return amb.ZtunnelsConnected() > 0 }); err != nil {
		d.step("the ztunnel stand-in connects to the agent", func() (string, error) { return "", err })
		return
	}
	fmt.Fprintf(d.out, "        ztunnel: meshwire's test proxy as its stand-in, root in the host's namespace, connected at %s\n", o.ZtunnelSocket)

	annotations := map[string]string{ambient.LabelDataplaneMode: "ambient"}
	caps := map[string]any{"io.kubernetes.cri.pod-annotations": annotations}
	args := [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", demoAmbientNS}, {"K8S_POD_NAME", demoAmbientPod}, {"K8S_POD_UID", demoAmbientUID}}
	rec := d.wire(demoAmbientPod, fmt.Sprintf("%s wired with the intercept plugin chained, annotated %s=ambient", demoAmbientPod, ambient.LabelDataplaneMode), list, caps, args...)
	if rec == nil {
		return
	}
	deleted := false
	defer func() {
		if !deleted { // interrupted, or a step failed: DEL before the agent stops
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, _ = d.rt.Del(ctx, demoAmbientPod)
		}
	}()
	d.step(fmt.Sprintf("%s enrolled and handed to ztunnel", demoAmbientPod), func() (string, error) {
		if _, err := zt.wait("add of workload "+demoAmbientUID, func(r proxylog.Record) bool {
			return r.Event == "add" && r.Workload == demoAmbientUID
		}); err != nil {
			return "", err
		}
		return fmt.Sprintf("ztunnel log: add workload %s; %d pod(s) enrolled", demoAmbientUID, amb.Enrolled()), nil
	})
	// from checks ztunnel's record: the pod's workload and the original
	// destination the app or the client dialed.
	from := func(addr string) func(proxylog.Record, string) error {
		return func(r proxylog.Record, _ string) error {
			if r.Workload != demoAmbientUID || r.OrigDst != addr {
				return fmt.Errorf("ztunnel relayed workload %q to %s, want %s to %s", r.Workload, r.OrigDst, demoAmbientUID, addr)
			}
			return nil
		}
	}
	if dst := podAddress(d.rt, b, true); dst != nil {
		addr := net.JoinHostPort(dst.String(), strconv.Itoa(demoPodPort))
		if srv := d.proxiedCall(zt, "outbound", fmt.Sprintf("%s app -> %s goes through ztunnel", demoAmbientPod, addr),
			rec.NetNS, b.NetNS, b.Name, addr, demoPodPort, from(addr)); srv != nil {
			defer srv.Close()
		}
	}
	if dst := podAddress(d.rt, rec, true); dst != nil {
		addr := net.JoinHostPort(dst.String(), strconv.Itoa(demoMeshApp))
		aIP := podAddress(d.rt, a, true)
		sees := func(r proxylog.Record, reply string) error {
			if err := from(addr)(r, reply); err != nil {
				return err
			}
			if aIP == nil || !strings.Contains(reply, "(you are "+aIP.String()+":") {
				return fmt.Errorf("the app does not see %s's address: %q", a.Name, reply)
			}
			return nil
		}
		if app := d.proxiedCall(zt, "inbound", fmt.Sprintf("%s -> %s app at %s goes through ztunnel, the app sees %s", a.Name, demoAmbientPod, addr, a.Name),
			a.NetNS, rec.NetNS, demoAmbientPod+" app", addr, demoMeshApp, sees); app != nil {
			defer app.Close()
		}
		probe := ambient.DefaultProbeSNAT.String()
		d.step(fmt.Sprintf("the host reaches %s app at %s uncaptured, from the probe address %s", demoAmbientPod, addr, probe), func() (string, error) {
			reply, err := fetchHello("", addr)
			if err != nil {
				return "", err
			}
			if !strings.Contains(reply, "(you are "+probe+":") {
				return "", fmt.Errorf("the app saw another source than the probe address: %q", reply)
			}
			if r, ok := zt.seen(300*time.Millisecond, func(r proxylog.Record) bool { return r.Event == "conn" }); ok {
				return "", fmt.Errorf("ztunnel relayed it: %s from %s to %s", r.Listener, r.Src, r.OrigDst)
			}
			return fmt.Sprintf("the host rule's SNAT; reply %q", reply), nil
		})
	}
	d.step(fmt.Sprintf("DEL of %s tells ztunnel the pod is gone", demoAmbientPod), func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := d.rt.Del(ctx, demoAmbientPod); err != nil {
			return "", err
		}
		deleted = true
		if _, err := zt.wait("del of workload "+demoAmbientUID, func(r proxylog.Record) bool {
			return r.Event == "del" && r.Workload == demoAmbientUID
		}); err != nil {
			return "", err
		}
		return fmt.Sprintf("ztunnel log: del workload %s; %d pod(s) enrolled", demoAmbientUID, amb.Enrolled()), nil
	})
}

// seen reports the first record that matches within d, if any.
func (s *sidecar) seen(d time.Duration, match func(proxylog.Record) bool) (proxylog.Record, bool) {
	deadline := time.Now().Add(d)
	for {
		left := time.Until(deadline)
		if left <= 0 {
			return proxylog.Record{}, false
		}
		r, err := s.next(left)
		if err != nil {
			return proxylog.Record{}, false
		}
		if match(r) {
			return r, true
		}
	}
}

// ambientHostClean checks that the host holds no rule and no set of
// ambient mode's: the chain ISTIO_POSTRT and the ipsets with iptables, the
// table istio-ambient-nat with native nftables.
func ambientHostClean(b firewall.Backend) error {
	if b.Kind == firewall.NFTables {
		if out, err := exec.Command("nft", "list", "table", "inet", ambient.NftTablePrefix+"nat").CombinedOutput(); err == nil {
			return fmt.Errorf("table inet %snat left:\n%s", ambient.NftTablePrefix, out)
		}
		return nil
	}
	out, err := exec.Command(b.String()+"-save", "-t", "nat").CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s-save: %v %s", b, err, out)
	}
	if strings.Contains(string(out), ambient.ChainPostrouting) {
		return fmt.Errorf("chain %s left in nat", ambient.ChainPostrouting)
	}
	for _, f := range []ruleset.IPVersion{ruleset.V4, ruleset.V6} {
		name := ambient.ProbeSetName(f)
		if _, err := netlink.IpsetList(name); err == nil {
			return fmt.Errorf("ipset %s left", name)
		}
	}
	return nil
}
