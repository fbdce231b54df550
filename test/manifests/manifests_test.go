// Package manifests checks the Kubernetes manifests in conf/kubernetes by
// decoding each document strictly into the Kubernetes API types (an
// unknown or misspelt field fails), and what meshwire's deployment relies
// on in them.
package manifests

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/cmd/meshwire/cli"
	"github.com/meshwire/meshwire/internal/nodelayout"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
)

const dir = "../../conf/kubernetes"

// documents returns every YAML document of every manifest, as JSON.
func documents(t *testing.T) map[string][][]byte {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", dir, err)
	}
	docs := map[string][][]byte{}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		docs[filepath.Base(f)] = splitDocuments(t, f, data)
	}
	return docs
}

// splitDocuments returns the YAML documents of data (from source), as
// JSON, leaving out the empty ones.
func splitDocuments(t *testing.T, source string, data []byte) [][]byte {
	t.Helper()
	var docs [][]byte
	r := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		j, err := yaml.ToJSON(doc)
		if err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		if string(j) != "null" { // only comments
			docs = append(docs, j)
		}
	}
}

// strict decodes JSON into v, refusing unknown fields.
func strict(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

func TestManifestsDecodeStrictly(t *testing.T) {
	for file, docs := range documents(t) {
		decodeStrictly(t, file, docs)
	}
}

// decodeStrictly decodes each of docs (from source) strictly into its
// Kubernetes API type.
func decodeStrictly(t *testing.T, source string, docs [][]byte) {
	t.Helper()
	for i, doc := range docs {
		var meta struct{ Kind, APIVersion string }
		if err := json.Unmarshal(doc, &meta); err != nil {
			t.Fatalf("%s #%d: %v", source, i, err)
		}
		var obj any
		switch meta.APIVersion + "/" + meta.Kind {
		case "apps/v1/DaemonSet":
			obj = &appsv1.DaemonSet{}
		case "v1/Pod":
			obj = &corev1.Pod{}
		case "v1/ServiceAccount":
			obj = &corev1.ServiceAccount{}
		case "v1/ConfigMap":
			obj = &corev1.ConfigMap{}
		case "rbac.authorization.k8s.io/v1/ClusterRole":
			obj = &rbacv1.ClusterRole{}
		case "rbac.authorization.k8s.io/v1/ClusterRoleBinding":
			obj = &rbacv1.ClusterRoleBinding{}
		default:
			t.Fatalf("%s #%d: kind %s %s has no check here", source, i, meta.APIVersion, meta.Kind)
		}
		if err := strict(doc, obj); err != nil {
			t.Errorf("%s #%d (%s): %v", source, i, meta.Kind, err)
		}
	}
}

// TestStrictDecodingRefusesTypos: the check above can fail.
func TestStrictDecodingRefusesTypos(t *testing.T) {
	if err := strict([]byte(`{"apiVersion":"v1","kind":"Pod","spec":{"initContainer":[]}}`), &corev1.Pod{}); err == nil {
		t.Fatal("a misspelt field was accepted")
	}
}

// TestDaemonSet checks the DaemonSet as shipped: the chained intercept
// plugin, its config change taken back on exit, the fast path.
func TestDaemonSet(t *testing.T) {
	docs := documents(t)["daemonset.yaml"]
	flags := checkDaemonSet(t, "daemonset.yaml", docs)
	for _, f := range []string{"--chain", "--cleanup-on-exit", "--fastpath"} {
		if _, ok := flags[f]; !ok {
			t.Errorf("node container lacks %s", f)
		}
	}
}

// checkDaemonSet checks what the node agent relies on in the DaemonSet of
// docs (from source): its mounts, probes, port and privileges are those
// its flags need, and the real command line accepts the flags. It returns
// the flags.
func checkDaemonSet(t *testing.T, source string, docs [][]byte) map[string]string {
	t.Helper()
	var ds appsv1.DaemonSet
	decodeDoc(t, source, docs, "DaemonSet", &ds)
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork || ds.Spec.Selector == nil || !labelsMatch(ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels) {
		t.Fatalf("want host network and a selector matching the template: %+v", ds.Spec)
	}
	if len(spec.Containers) != 1 {
		t.Fatalf("want the node agent as the one container, got %d", len(spec.Containers))
	}
	node := container(t, spec.Containers, "node")
	if len(node.Command) < 2 || node.Command[0] != "meshwire" || node.Command[1] != "node" {
		t.Fatalf("node container command: %q", node.Command)
	}
	flags := map[string]string{}
	for _, a := range node.Command[2:] {
		k, v, _ := strings.Cut(a, "=")
		flags[k] = v
	}
	_, fastpath := flags["--fastpath"]
	_, ambient := flags["--ambient"]
	privileged := node.SecurityContext != nil && node.SecurityContext.Privileged != nil && *node.SecurityContext.Privileged
	if (fastpath || ambient) && !privileged {
		t.Error("with --fastpath or --ambient the node agent needs privilege")
	}
	if sc := node.SecurityContext; !privileged && (sc == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL")) {
		t.Error("an unprivileged node agent drops every capability but those it adds")
	}
	// A grace period of 0 is a SIGKILL: no cleanup (unset is 30 s).
	if _, ok := flags["--cleanup-on-exit"]; ok && spec.TerminationGracePeriodSeconds != nil && *spec.TerminationGracePeriodSeconds < 5 {
		t.Errorf("terminationGracePeriodSeconds %d: with --cleanup-on-exit the agent needs time to take its config change back", *spec.TerminationGracePeriodSeconds)
	}
	if fastpath && !spec.HostPID {
		t.Error("with --fastpath the node agent needs the host's PID namespace: it sweeps the records of namespaces gone from every process's")
	}

	// Each mount is the host's directory, at /host + its path or at the
	// same path, or the ConfigMap holding --conflist; the directories the
	// agent is given are mounted.
	mounts := map[string]bool{}
	var conflist []byte // the ConfigMap's, for the command line below
	for _, m := range node.VolumeMounts {
		i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if file, ok := flags["--conflist"]; ok && i >= 0 && spec.Volumes[i].ConfigMap != nil && filepath.Dir(file) == m.MountPath {
			var cm corev1.ConfigMap
			decodeDoc(t, source, docs, "ConfigMap", &cm)
			conflist = []byte(cm.Data[filepath.Base(file)])
			if cm.Name != spec.Volumes[i].ConfigMap.Name || cm.Namespace != ds.Namespace || len(conflist) == 0 {
				t.Errorf("--conflist=%s: the ConfigMap %s/%s has no %s", file, ds.Namespace, spec.Volumes[i].ConfigMap.Name, filepath.Base(file))
			}
			mounts[m.MountPath] = true
			continue
		}
		if i < 0 || spec.Volumes[i].HostPath == nil {
			t.Errorf("mount %s (volume %s) is not a host directory", m.MountPath, m.Name)
			continue
		}
		// (or at a path that leads there on the host: /var/run/netns,
		// where runtimes name the pods' namespaces, is /run/netns).
		if host := spec.Volumes[i].HostPath.Path; m.MountPath != "/host"+host && m.MountPath != host && !linksTo(m.MountPath, host) {
			t.Errorf("mount %s is the host's %s", m.MountPath, host)
		}
		mounts[m.MountPath] = true
		// The runtime checks a propagated mount's source by its path,
		// without following links: a path through a link (/var/run ->
		// /run) is judged by the mount of the link's directory, the root
		// file system, private on a host without systemd (found on the
		// single-node cluster: CreateContainerError).
		if host := spec.Volumes[i].HostPath.Path; m.MountPropagation != nil && *m.MountPropagation != corev1.MountPropagationNone {
			if real, err := filepath.EvalSymlinks(host); err == nil && real != host {
				t.Errorf("mount %s (%s propagation): its host path %s goes through a link to %s: use that path", m.MountPath, *m.MountPropagation, host, real)
			}
		}
	}
	need := map[string]string{
		"--cni-bin-dir": flags["--cni-bin-dir"], "--cni-conf-dir": flags["--cni-conf-dir"],
		"--plugin-log": filepath.Dir(flags["--plugin-log"]),
		// the pods' records, which the agent repairs from, replays into
		// the fast path it attaches and enrolls in ambient mode
		"pods' records": nodelayout.Default().Pods(),
		// the stores of earlier versions, which the agent moves into the
		// records (a node upgraded in place)
		"earlier calls": nodelayout.Default().LegacyCalls(),
		// ambient mode (off as shipped, its mounts there for --ambient):
		// the plugin's socket, ztunnel's ZDS socket
		"--ambient state":  nodelayout.Default().Ambient(),
		"--ztunnel-socket": filepath.Dir(nodelayout.ZtunnelSocket),
	}
	if fastpath {
		need["--cgroup"] = flags["--cgroup"]
		// the policies of earlier versions, for the fast path's replay
		need["earlier policies"] = nodelayout.Default().LegacyFastpath()
	}
	if file, ok := flags["--conflist"]; ok {
		need["--conflist"] = filepath.Dir(file)
	}
	for flag, dir := range need {
		if !mounts[dir] {
			t.Errorf("%s: %q is not a mounted host directory", flag, dir)
		}
	}
	// The plugin log is written into the CNI config: the plugins write it
	// on the host, the agent reads it here.
	if log := flags["--plugin-log"]; !strings.HasPrefix(log, "/") || !sameOnHost(spec, node, filepath.Dir(log)) {
		t.Errorf("the plugin log %q must have the same path on the host (it is written into the CNI config)", log)
	}

	// The probes and the metrics port are where the agent listens, on
	// the node's IP (host network: the kubelet probes that address).
	listen := flags["--listen"]
	if !strings.HasPrefix(listen, "[$(NODE_IP)]:") {
		t.Errorf("--listen=%q: want the node's IP from the downward API", listen)
	}
	if !fromField(node.Env, "NODE_IP", "status.hostIP") {
		t.Error("NODE_IP is not the node's IP (status.hostIP)")
	}
	if !fromField(node.Env, "NODE_NAME", "spec.nodeName") {
		t.Error("NODE_NAME is not the node's name (spec.nodeName): the agent watches the pods of its node")
	}
	port := listen[strings.LastIndex(listen, ":")+1:]
	for what, p := range map[string]*corev1.Probe{"/readyz": node.ReadinessProbe, "/healthz": node.LivenessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != what || p.HTTPGet.Port.String() != port {
			t.Errorf("no probe of %s on port %s: %+v", what, port, p)
		}
	}
	if len(node.Ports) != 1 || strconv.Itoa(int(node.Ports[0].ContainerPort)) != port {
		t.Errorf("container ports %+v, want %s", node.Ports, port)
	}

	// The real command line accepts every flag: it fails on the missing
	// directories, never with a usage error (the conflist is the
	// ConfigMap's).
	args := []string{"node"}
	for _, a := range node.Command[2:] {
		switch k, _, _ := strings.Cut(a, "="); k {
		case "--cni-bin-dir", "--cni-conf-dir":
			a = k + "=" + filepath.Join(t.TempDir(), "missing")
		case "--conflist":
			f := filepath.Join(t.TempDir(), "meshwire.conflist")
			if err := os.WriteFile(f, conflist, 0o644); err != nil {
				t.Fatal(err)
			}
			a = k + "=" + f
		}
		args = append(args, a)
	}
	var stderr strings.Builder
	if code := cli.Main(args, []byte("{}"), io.Discard, &stderr); code != 1 {
		t.Errorf("meshwire %q: exit %d, want 1 (the missing directories): %s", args, code, stderr.String())
	}
	return flags
}

// sameOnHost tells whether the container mounts the host's dir at dir.
func sameOnHost(spec corev1.PodSpec, c corev1.Container, dir string) bool {
	for _, m := range c.VolumeMounts {
		i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if m.MountPath == dir && i >= 0 && spec.Volumes[i].HostPath != nil && spec.Volumes[i].HostPath.Path == dir {
			return true
		}
	}
	return false
}

func TestSamplePod(t *testing.T) {
	var pod corev1.Pod
	if err := strict(documents(t)["pod-iptables-init.yaml"][0], &pod); err != nil {
		t.Fatal(err)
	}
	if len(pod.Spec.InitContainers) != 1 {
		t.Fatalf("want one init container, got %d", len(pod.Spec.InitContainers))
	}
	ic := pod.Spec.InitContainers[0]
	sc := ic.SecurityContext
	if sc == nil || sc.Capabilities == nil || (sc.Privileged != nil && *sc.Privileged) {
		t.Fatal("the init container must be unprivileged with explicit capabilities")
	}
	caps := map[corev1.Capability]bool{}
	for _, c := range sc.Capabilities.Add {
		caps[c] = true
	}
	if !caps["NET_ADMIN"] || !caps["NET_RAW"] || len(caps) != 2 || !slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("init container capabilities: add %v drop %v, want NET_ADMIN and NET_RAW only", sc.Capabilities.Add, sc.Capabilities.Drop)
	}
	if !slices.Equal(ic.Command, []string{"iptables-init"}) || !slices.Contains(ic.Args, "-m") || !slices.Contains(ic.Args, "REDIRECT") {
		t.Errorf("init container command %q args %q", ic.Command, ic.Args)
	}
	if _, ok := pod.Annotations["sidecar.istio.io/status"]; !ok {
		t.Error("the sample pod should carry the injector's status annotation")
	}
}

// fromField tells whether env sets name from the pod's field at path
// (the downward API).
func fromField(env []corev1.EnvVar, name, path string) bool {
	i := slices.IndexFunc(env, func(e corev1.EnvVar) bool { return e.Name == name })
	return i >= 0 && env[i].ValueFrom != nil && env[i].ValueFrom.FieldRef != nil && env[i].ValueFrom.FieldRef.FieldPath == path
}

// decodeDoc decodes strictly into v the one document of kind among docs
// (from source).
func decodeDoc(t *testing.T, source string, docs [][]byte, kind string, v any) {
	t.Helper()
	var found [][]byte
	for _, doc := range docs {
		var meta struct{ Kind string }
		if err := json.Unmarshal(doc, &meta); err == nil && meta.Kind == kind {
			found = append(found, doc)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%s: %d documents of kind %s, want one", source, len(found), kind)
	}
	if err := strict(found[0], v); err != nil {
		t.Fatalf("%s: %s: %v", source, kind, err)
	}
}

// linksTo reports whether path leads to target through links on this host.
func linksTo(path, target string) bool {
	real, err := filepath.EvalSymlinks(path)
	return err == nil && real == target
}

func container(t *testing.T, cs []corev1.Container, name string) corev1.Container {
	t.Helper()
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

func labelsMatch(sel, labels map[string]string) bool {
	for k, v := range sel {
		if labels[k] != v {
			return false
		}
	}
	return len(sel) > 0
}

// TestDaemonSetAPIAccess: the node agent reads pods and namespaces (which
// pods Istio's ambient mode enrolls) with its own ServiceAccount, whose
// token is mounted, and may do nothing else.
func TestDaemonSetAPIAccess(t *testing.T) {
	for _, p := range loadAPIAccess(t, "daemonset.yaml", documents(t)["daemonset.yaml"]).problems() {
		t.Error(p)
	}
}

// TestAPIAccessCheckFails: the check above catches more rights, fewer
// rights, another subject and no token.
func TestAPIAccessCheckFails(t *testing.T) {
	no := false
	for name, spoil := range map[string]func(a *apiAccess){
		"a write verb":          func(a *apiAccess) { a.role.Rules[0].Verbs = append(a.role.Rules[0].Verbs, "patch") },
		"every verb":            func(a *apiAccess) { a.role.Rules[0].Verbs = []string{"*"} },
		"secrets":               func(a *apiAccess) { a.role.Rules[0].Resources = append(a.role.Rules[0].Resources, "secrets") },
		"another group":         func(a *apiAccess) { a.role.Rules[0].APIGroups = []string{"apps"} },
		"no watch":              func(a *apiAccess) { a.role.Rules[0].Verbs = []string{"get", "list"} },
		"no namespaces":         func(a *apiAccess) { a.role.Rules[0].Resources = []string{"pods"} },
		"every DaemonSet":       func(a *apiAccess) { a.role.Rules[1].ResourceNames = nil },
		"no DaemonSet":          func(a *apiAccess) { a.role.Rules = a.role.Rules[:1] },
		"another subject":       func(a *apiAccess) { a.binding.Subjects[0].Namespace = "default" },
		"another role":          func(a *apiAccess) { a.binding.RoleRef.Name = "cluster-admin" },
		"the default account":   func(a *apiAccess) { a.ds.Spec.Template.Spec.ServiceAccountName = "" },
		"no token in the pod":   func(a *apiAccess) { a.ds.Spec.Template.Spec.AutomountServiceAccountToken = &no },
		"no token for the SA":   func(a *apiAccess) { a.sa.AutomountServiceAccountToken = &no },
		"the SA somewhere else": func(a *apiAccess) { a.sa.Namespace = "default" },
	} {
		a := loadAPIAccess(t, "daemonset.yaml", documents(t)["daemonset.yaml"])
		spoil(&a)
		if len(a.problems()) == 0 {
			t.Errorf("%s: the check passes", name)
		}
	}
}

// apiAccess is the node agent's access to the API server, as the
// manifest gives it.
type apiAccess struct {
	ds      appsv1.DaemonSet
	sa      corev1.ServiceAccount
	role    rbacv1.ClusterRole
	binding rbacv1.ClusterRoleBinding
}

// loadAPIAccess reads the node agent's access from docs (from source).
func loadAPIAccess(t *testing.T, source string, docs [][]byte) apiAccess {
	t.Helper()
	var a apiAccess
	decodeDoc(t, source, docs, "DaemonSet", &a.ds)
	decodeDoc(t, source, docs, "ServiceAccount", &a.sa)
	decodeDoc(t, source, docs, "ClusterRole", &a.role)
	decodeDoc(t, source, docs, "ClusterRoleBinding", &a.binding)
	return a
}

// agentNeeds are the resources (of the core group) the agent watches;
// readOnly the verbs it may have, of which an informer needs list and
// watch.
var (
	agentNeeds = []string{"pods", "namespaces"}
	readOnly   = []string{"get", "list", "watch"}
)

// problems lists what is wrong with a.
func (a apiAccess) problems() []string {
	var out []string
	spec := a.ds.Spec.Template.Spec
	if spec.ServiceAccountName != a.sa.Name || a.sa.Namespace != a.ds.Namespace {
		out = append(out, "the DaemonSet runs as "+a.ds.Namespace+"/"+spec.ServiceAccountName+", not as the manifest's ServiceAccount "+a.sa.Namespace+"/"+a.sa.Name)
	}
	// The pod's setting wins over the ServiceAccount's.
	if mount := spec.AutomountServiceAccountToken; (mount != nil && !*mount) || (mount == nil && a.sa.AutomountServiceAccountToken != nil && !*a.sa.AutomountServiceAccountToken) {
		out = append(out, "the ServiceAccount's token is not mounted: the agent cannot reach the API server")
	}
	if r := a.binding.RoleRef; r.APIGroup != rbacv1.GroupName || r.Kind != "ClusterRole" || r.Name != a.role.Name {
		out = append(out, fmt.Sprintf("the ClusterRoleBinding refers to %+v, not to the ClusterRole %s", r, a.role.Name))
	}
	want := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: a.sa.Name, Namespace: a.sa.Namespace}
	if len(a.binding.Subjects) != 1 || a.binding.Subjects[0] != want {
		out = append(out, fmt.Sprintf("the ClusterRoleBinding binds %+v, want only %+v", a.binding.Subjects, want))
	}
	if a.role.AggregationRule != nil {
		out = append(out, "the ClusterRole aggregates others")
	}
	granted := map[string][]string{} // resource: verbs
	// --keep-while-daemonset: the agent gets its own DaemonSet when it
	// stops, by name, and nothing else of the apps group.
	keep, ownDS := "", false
	for _, c := range spec.Containers {
		for _, arg := range c.Command {
			if v, ok := strings.CutPrefix(arg, "--keep-while-daemonset="); ok {
				keep = v
			}
		}
	}
	if keep != "" && keep != a.ds.Namespace+"/"+a.ds.Name {
		out = append(out, fmt.Sprintf("--keep-while-daemonset=%s, not the DaemonSet's own %s/%s", keep, a.ds.Namespace, a.ds.Name))
	}
	for _, r := range a.role.Rules {
		if slices.Equal(r.APIGroups, []string{"apps"}) {
			if !slices.Equal(r.Resources, []string{"daemonsets"}) || !slices.Equal(r.Verbs, []string{"get"}) ||
				!slices.Equal(r.ResourceNames, []string{a.ds.Name}) || len(r.NonResourceURLs) > 0 || keep == "" {
				out = append(out, fmt.Sprintf("rule %+v: the apps group's one rule is get of the agent's own DaemonSet %s by name, with --keep-while-daemonset", r, a.ds.Name))
			}
			ownDS = true
			continue
		}
		if !slices.Equal(r.APIGroups, []string{""}) || len(r.NonResourceURLs) > 0 {
			out = append(out, fmt.Sprintf("rule %+v: want the core group's resources only", r))
		}
		for _, res := range r.Resources {
			if !slices.Contains(agentNeeds, res) {
				out = append(out, fmt.Sprintf("rule %+v: %q is not a resource the agent reads", r, res))
			}
			for _, v := range r.Verbs {
				if !slices.Contains(readOnly, v) {
					out = append(out, fmt.Sprintf("rule %+v: verb %q is more than read access", r, v))
				}
				granted[res] = append(granted[res], v)
			}
		}
	}
	if keep != "" && !ownDS {
		out = append(out, "--keep-while-daemonset without the right to get the DaemonSet: every update would take the config change back")
	}
	for _, res := range agentNeeds {
		for _, v := range []string{"list", "watch"} {
			if !slices.Contains(granted[res], v) {
				out = append(out, fmt.Sprintf("the ClusterRole does not %s %s: the agent's informer needs it", v, res))
			}
		}
	}
	return out
}
