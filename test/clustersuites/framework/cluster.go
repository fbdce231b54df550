// Package framework is what meshwire's cluster suites (test/clustersuites) share,
// in the manner of Kubernetes' test/e2e/framework: the running cluster as
// cluster.sh up described it (its nodes, where the host sees their files,
// how to run a command in each), a client-go client, one way to report a
// check, and the few operations the suites need on pods (apply a manifest,
// exec, logs, wait).
package framework

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/meshwire/meshwire/test/harness"
)

// Description is $STATE/cluster.json, written by cluster.sh up.
type Description struct {
	State      string `json:"state"`
	Bin        string `json:"bin"`
	Repo       string `json:"repo"`
	Kubeconfig string `json:"kubeconfig"`
	CNI        string `json:"cni"`
	Runtime    string `json:"runtime"`   // containerd (1.6) or containerd2
	ProxyMode  string `json:"proxyMode"` // kube-proxy's: iptables or nftables
	Firewall   string `json:"firewall"`  // the backend meshwire's plugins are forced to, or empty`
	Install    string `json:"install"`   // how meshwire's DaemonSet was installed: kubectl (or empty) or helm
	// From is the commit whose meshwire the nodes started on (make
	// cluster FROM=), the mesh suite's rollout being the upgrade to this
	// tree's; empty: they started on this tree's.
	From string `json:"from"`
	// Fortio says whether fortio's image is on the nodes (INSTALL=helm or
	// FORTIO=1: build.sh fortio's localhost/fortio:meshwire-test).
	Fortio bool `json:"fortio"`
	// IPFamily is ipv4 or dual (empty: a cluster from before dual
	// stack, IPv4 only); Family says which.
	IPFamily string `json:"ipFamily"`
	// PodCgroups: kubelet makes its pod cgroups (cluster.sh's
	// MESHWIRE_CLUSTER_POD_CGROUPS=1).
	PodCgroups  bool   `json:"podCgroups"`
	PodCIDR     string `json:"podCIDR"`
	ServiceCIDR string `json:"serviceCIDR"`
	// PodCIDR6 and ServiceCIDR6 are the IPv6 ranges of a dual-stack
	// cluster, empty otherwise.
	PodCIDR6     string `json:"podCIDR6"`
	ServiceCIDR6 string `json:"serviceCIDR6"`
	APIIP        string `json:"apiIP"`
	Nodes        []Node `json:"nodes"`
}

// Family is the cluster's address families: ipv4 or dual.
func (d Description) Family() string {
	if d.IPFamily == "" {
		return "ipv4"
	}
	return d.IPFamily
}

// Node is one node of the cluster.
type Node struct {
	Name string `json:"name"`
	IP   string `json:"ip"`
	// Dir is the node's directory (its disk), empty for the single node
	// that runs on the host itself.
	Dir string `json:"dir"`
	// PluginLog is where the host sees the node's CNI plugin log
	// (/var/log/meshwire/cni.log on the node).
	PluginLog string `json:"pluginLog"`
	// VarLibCNI is where the host sees the node's /var/lib/cni.
	VarLibCNI string `json:"varLibCNI"`
	// CRISocket is the node's containerd socket, as the host sees it.
	CRISocket string `json:"criSocket"`
	// RuntimeLog is the node's containerd log.
	RuntimeLog string `json:"runtimeLog"`
	// Enter is the command prefix that runs a command in the node's
	// namespaces (empty on the host's node).
	Enter []string `json:"enter"`
}

// Command is name with args run in the node.
func (n Node) Command(name string, args ...string) *exec.Cmd {
	argv := append(append(append([]string{}, n.Enter...), name), args...)
	return exec.Command(argv[0], argv[1:]...)
}

// Cluster is the running cluster and a client of its API server.
type Cluster struct {
	Description
	Config *rest.Config
	Client kubernetes.Interface
}

// StateDir is the cluster's state directory (cluster.sh's
// MESHWIRE_CLUSTER_STATE).
func StateDir() string {
	if d := os.Getenv("MESHWIRE_CLUSTER_STATE"); d != "" {
		return d
	}
	return "/var/lib/meshwire-cluster"
}

// Load reads the running cluster's description, or fails t: a suite never
// passes for want of a cluster.
func Load(t testing.TB) *Cluster {
	t.Helper()
	c, err := LoadCluster()
	if err != nil {
		t.Fatalf("no running cluster to test (make cluster first): %v", err)
	}
	// One cluster at a time runs on a host, and a checkout's suites test
	// its own (another worktree's cluster is another change under test).
	if root, err := harness.RepoRoot(); err == nil && c.Repo != "" && c.Repo != root {
		t.Fatalf("the running cluster is %s's, not this checkout's (%s): wait until it is down (flock /run/meshwire-cluster-slot.lock around up, the suites and down)", c.Repo, root)
	}
	return c
}

// LoadCluster reads the running cluster's description and makes a client.
func LoadCluster() (*Cluster, error) {
	b, err := os.ReadFile(filepath.Join(StateDir(), "cluster.json"))
	if err != nil {
		return nil, err
	}
	c := &Cluster{}
	if err := json.Unmarshal(b, &c.Description); err != nil {
		return nil, fmt.Errorf("cluster.json: %w", err)
	}
	if len(c.Nodes) == 0 {
		return nil, fmt.Errorf("cluster.json names no node")
	}
	if c.Config, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig); err != nil {
		return nil, err
	}
	c.Config.QPS, c.Config.Burst = 50, 100
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return nil, err
	}
	return c, nil
}

// Node returns the node named name.
func (c *Cluster) Node(name string) (Node, error) {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return Node{}, fmt.Errorf("no node %q in the cluster's description", name)
}

// Script is cluster.sh, for the suites that take clusters up and down.
func (c *Cluster) Script() string { return ScriptPath(c.Repo) }

// Control stops (verb "stop") or starts again ("start") one of the
// control plane's processes, such as kube-apiserver (cluster.sh control).
func (c *Cluster) Control(verb, name string) error {
	out, err := exec.Command(c.Script(), "control", verb, name).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cluster.sh control %s %s: %v: %s", verb, name, err, out)
	}
	return nil
}

// IstioCNI renders istio-cni's DaemonSet again in mode (sidecar or
// ambient) and applies it, on an istio-cni cluster (cluster.sh
// istio-cni MODE); it returns once the DaemonSet is rolled out.
func (c *Cluster) IstioCNI(mode string) error {
	out, err := exec.Command(c.Script(), "istio-cni", mode).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cluster.sh istio-cni %s: %v: %s", mode, err, out)
	}
	return nil
}

// ScriptPath is cluster.sh in the repository at repo.
func ScriptPath(repo string) string { return filepath.Join(repo, "test", "cluster", "cluster.sh") }

// Helm runs helm, build.sh helm's beside the cluster's binaries, against
// the cluster, with its files under the state directory, as cluster.sh
// runs it (hc); it returns helm's output.
func (c *Cluster) Helm(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(filepath.Dir(c.Bin), "helm", "helm"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+filepath.Join(c.State, "helm", "config"),
		"HELM_CACHE_HOME="+filepath.Join(c.State, "helm", "cache"), "HELM_DATA_HOME="+filepath.Join(c.State, "helm", "data"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
