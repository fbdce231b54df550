package interceptenv

import (
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"

	"github.com/meshwire/meshwire/ebpf/capture"
	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/test/harness"
)

// Fastpath runs the built `meshwire fastpath ARGS` and returns its exit code
// and combined output; err is set only when it could not run at all.
func Fastpath(h *harness.H, args ...string) (int, string, error) {
	cmd := exec.Command(filepath.Join(h.BinDir, "meshwire"), append([]string{"fastpath"}, args...)...)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode(), string(out), nil
	}
	return 0, string(out), err
}

// FastpathStatus is `meshwire fastpath status --json`, decoded.
func FastpathStatus(h *harness.H) (fastpath.Status, error) {
	var st fastpath.Status
	return st, status(h, &st)
}

// CaptureStatus is the ebpf interception part of `meshwire fastpath status
// --json`, decoded.
func CaptureStatus(h *harness.H) (capture.Status, error) {
	var st struct {
		Capture capture.Status `json:"ebpf_interception"`
	}
	err := status(h, &st)
	return st.Capture, err
}

func status(h *harness.H, v any) error {
	code, out, err := Fastpath(h, "status", "--json")
	if err == nil && code != 0 {
		err = fmt.Errorf("exit %d: %s", code, strings.TrimSpace(out))
	}
	if err == nil {
		err = json.Unmarshal([]byte(out), v)
	}
	if err != nil {
		return fmt.Errorf("meshwire fastpath status --json: %w", err)
	}
	return nil
}

// NoNetfilter reports what EBPF mode must not leave in a pod's namespace
// ns: a conntrack entry, an nftables rule, an iptables table.
func NoNetfilter(ns *harness.NS) error {
	out, err := ns.Exec("conntrack", "-L")
	if err != nil {
		return fmt.Errorf("conntrack -L in %s: %v\n%s", ns.Name, err, out)
	}
	if !strings.Contains(out, " 0 flow entries have been shown") {
		return fmt.Errorf("%s has conntrack entries, want none:\n%s", ns.Name, out)
	}
	for _, tool := range [][]string{{"nft", "list", "ruleset"}, {"cat", "/proc/net/ip_tables_names"}, {"cat", "/proc/net/ip6_tables_names"}} {
		out, err := ns.Exec(tool[0], tool[1:]...)
		if err != nil {
			return fmt.Errorf("%s in %s: %v\n%s", strings.Join(tool, " "), ns.Name, err, out)
		}
		if strings.TrimSpace(out) != "" {
			return fmt.Errorf("%s in %s shows rules or tables:\n%s", strings.Join(tool, " "), ns.Name, out)
		}
	}
	return nil
}

// ChainedIntercept is the chained intercept plugin (after loopback) as
// containerd runs it for a Kubernetes pod of namespace "shop" in network
// namespace ns with these annotations.
func ChainedIntercept(h *harness.H, name string, ns *harness.NS, annotations map[string]string) *harness.Attachment {
	list := h.ConfList(fmt.Sprintf(`{"cniVersion":"1.1.0","name":%q,"plugins":[{"type":"loopback"},
		{"type":"intercept","istio-service-cidr":"*","istio-inbound-ports":"*","dual-stack":true,
		 "capabilities":{%q:true}}]}`, name, "io.kubernetes.cri.pod-annotations"))
	return PodAttach(h, list, ns, "shop", annotations)
}

// PodAttach attaches list to lo in network namespace ns as containerd
// does for Kubernetes pod p1 of namespace podNamespace: its annotations
// as the pod-annotations capability, K8S_POD_* in CNI_ARGS.
func PodAttach(h *harness.H, list *libcni.NetworkConfigList, ns *harness.NS, podNamespace string, annotations map[string]string) *harness.Attachment {
	a := h.Attach(list, ns, "lo", map[string]any{"io.kubernetes.cri.pod-annotations": annotations})
	a.RT.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", podNamespace}, {"K8S_POD_NAME", "p1"}, {"K8S_POD_INFRA_CONTAINER_ID", a.RT.ContainerID}}
	return a
}
