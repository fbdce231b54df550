package manifests

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"helm.sh/helm/v3/pkg/chartutil"
)

// istio-cni as the cluster installs it (MESHWIRE_CLUSTER_CNI=istio-cni):
// Istio's own chart, manifests/charts/istio-cni of the istio.io/istio
// module that test/cluster/build.sh pins, rendered with
// test/cluster/manifests/istio-cni/values.yaml and the node's directories,
// as test/cluster/peers.sh render renders it with the helm command.
const (
	clusterDir    = "../cluster"
	istioValues   = clusterDir + "/manifests/istio-cni/values.yaml"
	istioImage    = "localhost/istio/install-cni:meshwire-test"
	istioNS       = "istio-system"
	nodeCNIBinDir = "/var/lib/meshwire-cluster/cni/bin" // the single node's (cluster.sh's CNI_BIN)
	nodeCNIConf   = "/var/lib/meshwire-cluster/cni/net.d"
)

// istioVersion is build.sh's ISTIO_VERSION, the one pin of Istio's
// binaries, images and chart.
func istioVersion(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(clusterDir, "build.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^ISTIO_VERSION=(\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("build.sh: no ISTIO_VERSION")
	}
	return string(m[1])
}

// istioChart is the directory of istio-cni's chart in the pinned module,
// downloaded through the Go module proxy when the module cache lacks it
// (asked outside this module: go.mod and go.sum stay as they are).
func istioChart(t *testing.T) string {
	t.Helper()
	v := istioVersion(t)
	cmd := exec.Command("go", "mod", "download", "-json", "istio.io/istio@"+v)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download istio.io/istio@%s: %v: %s%s", v, err, out, stderr.String())
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download istio.io/istio@%s: %v %s: %s", v, err, mod.Error, out)
	}
	return filepath.Join(mod.Dir, "manifests", "charts", "istio-cni")
}

// renderIstioCNI renders the chart as peers.sh render MODE does.
func renderIstioCNI(t *testing.T, chart, mode string) string {
	t.Helper()
	values, err := chartutil.ReadValuesFile(istioValues)
	if err != nil {
		t.Fatal(err)
	}
	values["cniBinDir"], values["cniConfDir"] = nodeCNIBinDir, nodeCNIConf
	if mode == "ambient" {
		values["profile"] = "ambient"
	}
	out, err := renderChart(chart, "istio-cni", istioNS, values)
	if err != nil {
		t.Fatalf("helm template of %s (%s): %v", chart, mode, err)
	}
	return out
}

// istioCNIProblems is what is wrong with a rendering of istio-cni's chart
// for the cluster in mode (sidecar or ambient): the DaemonSet's images are
// not the one the cluster imports, or not used as imported; it is not
// chained into the node's conflist; its host paths are not the node's
// directories; ambient is not as mode says.
func istioCNIProblems(t *testing.T, source, mode string, docs [][]byte) []string {
	t.Helper()
	var p []string
	var ds *appsv1.DaemonSet
	var cm *corev1.ConfigMap
	for _, d := range docs {
		var meta struct {
			Kind     string
			Metadata struct{ Name, Namespace string }
		}
		if err := json.Unmarshal(d, &meta); err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		if meta.Kind != "ClusterRole" && meta.Kind != "ClusterRoleBinding" && meta.Metadata.Namespace != istioNS {
			p = append(p, fmt.Sprintf("%s %s: in namespace %q, not %s", meta.Kind, meta.Metadata.Name, meta.Metadata.Namespace, istioNS))
		}
		switch meta.Kind {
		case "DaemonSet":
			ds = &appsv1.DaemonSet{}
			if err := json.Unmarshal(d, ds); err != nil {
				t.Fatalf("%s: DaemonSet: %v", source, err)
			}
		case "ConfigMap":
			cm = &corev1.ConfigMap{}
			if err := json.Unmarshal(d, cm); err != nil {
				t.Fatalf("%s: ConfigMap: %v", source, err)
			}
		}
	}
	if ds == nil || cm == nil {
		return append(p, fmt.Sprintf("no DaemonSet (%v) or no ConfigMap (%v)", ds != nil, cm != nil))
	}
	if ds.Name != "istio-cni-node" {
		p = append(p, "the DaemonSet is "+ds.Name+", not istio-cni-node")
	}
	spec := ds.Spec.Template.Spec
	for _, c := range append(append([]corev1.Container{}, spec.InitContainers...), spec.Containers...) {
		if c.Image != istioImage {
			p = append(p, fmt.Sprintf("container %s: image %s, not %s (the one the cluster imports)", c.Name, c.Image, istioImage))
		}
		if c.ImagePullPolicy != corev1.PullIfNotPresent && c.ImagePullPolicy != corev1.PullNever {
			p = append(p, fmt.Sprintf("container %s: pull policy %q: the cluster has no registry", c.Name, c.ImagePullPolicy))
		}
	}
	hostPaths := map[string]string{}
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths[v.Name] = v.HostPath.Path
		}
	}
	for vol, want := range map[string]string{"cni-bin-dir": nodeCNIBinDir, "cni-net-dir": nodeCNIConf, "cni-netns-dir": "/run/netns"} {
		if hostPaths[vol] != want {
			p = append(p, fmt.Sprintf("volume %s: host path %q, not the node's %s", vol, hostPaths[vol], want))
		}
	}
	ambient := "false"
	if mode == "ambient" {
		ambient = "true"
	}
	for k, want := range map[string]string{
		"CHAINED_CNI_PLUGIN":     "true",  // istio-cni chained after the node's bridge and host-local
		"ISTIO_OWNED_CNI_CONFIG": "false", // into the node's own conflist, not a file of Istio's
		"AMBIENT_ENABLED":        ambient,
		"EXCLUDE_NAMESPACES":     "kube-system",
	} {
		if got, ok := cm.Data[k]; !ok || got != want {
			p = append(p, fmt.Sprintf("ConfigMap %s: %s=%q, want %q", cm.Name, k, got, want))
		}
	}
	if name, ok := cm.Data["CNI_CONF_NAME"]; ok {
		p = append(p, "ConfigMap: CNI_CONF_NAME="+name+": istio-cni must chain into the node's first conflist, whatever its name")
	}
	return p
}

// TestIstioCNIChart: Istio's chart renders, for both modes, what the
// cluster's istio-cni network needs; and peers.sh check, which stands
// between the rendering and kubectl apply, passes it and refuses it with
// an image from elsewhere.
func TestIstioCNIChart(t *testing.T) {
	chart := istioChart(t)
	for _, mode := range []string{"sidecar", "ambient"} {
		t.Run(mode, func(t *testing.T) {
			out := renderIstioCNI(t, chart, mode)
			for _, problem := range istioCNIProblems(t, chart, mode, splitDocuments(t, chart, []byte(out))) {
				t.Error(problem)
			}
			if err := peersCheck(out); err != nil {
				t.Errorf("peers.sh check refuses the rendering: %v", err)
			}
			pulled := strings.Replace(out, istioImage, "docker.io/istio/install-cni:1.30.3", 1)
			if pulled == out {
				t.Fatalf("no image %s in the rendering", istioImage)
			}
			if peersCheck(pulled) == nil {
				t.Error("peers.sh check passes a DaemonSet whose image would be pulled from docker.io")
			}
		})
	}
}

// TestIstioCNIProblemsFail: each problem istioCNIProblems looks for is
// found in a rendering that has it.
func TestIstioCNIProblemsFail(t *testing.T) {
	chart := istioChart(t)
	out := renderIstioCNI(t, chart, "sidecar")
	for what, edit := range map[string][2]string{
		"another image":         {istioImage, "registry.istio.io/testing/install-cni:latest"},
		"not chained":           {`CHAINED_CNI_PLUGIN: "true"`, `CHAINED_CNI_PLUGIN: "false"`},
		"the host's bin dir":    {"path: " + nodeCNIBinDir, "path: /opt/cni/bin"},
		"ambient when sidecar":  {`AMBIENT_ENABLED: "false"`, `AMBIENT_ENABLED: "true"`},
		"a conflist of its own": {`ISTIO_OWNED_CNI_CONFIG: "false"`, `ISTIO_OWNED_CNI_CONFIG: "true"`},
	} {
		broken := strings.Replace(out, edit[0], edit[1], 1)
		if broken == out {
			t.Errorf("%s: no %q in the rendering", what, edit[0])
			continue
		}
		if len(istioCNIProblems(t, what, "sidecar", splitDocuments(t, what, []byte(broken)))) == 0 {
			t.Errorf("%s: no problem found", what)
		}
	}
}

// peersCheck runs peers.sh check on a rendering.
func peersCheck(manifest string) error {
	cmd := exec.Command("bash", filepath.Join(clusterDir, "peers.sh"), "check", "-")
	cmd.Stdin = strings.NewReader(manifest)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	if string(out) != manifest+"\n" && string(out) != manifest {
		return fmt.Errorf("it printed something other than the manifest (%d bytes, not %d)", len(out), len(manifest))
	}
	return nil
}
