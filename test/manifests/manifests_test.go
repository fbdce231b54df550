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
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
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
		r := yaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			j, err := yaml.ToJSON(doc)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			docs[filepath.Base(f)] = append(docs[filepath.Base(f)], j)
		}
	}
	return docs
}

// strict decodes JSON into v, refusing unknown fields.
func strict(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	return d.Decode(v)
}

func TestManifestsDecodeStrictly(t *testing.T) {
	for file, docs := range documents(t) {
		for i, doc := range docs {
			var meta struct{ Kind, APIVersion string }
			if err := json.Unmarshal(doc, &meta); err != nil {
				t.Fatalf("%s #%d: %v", file, i, err)
			}
			var obj any
			switch meta.APIVersion + "/" + meta.Kind {
			case "apps/v1/DaemonSet":
				obj = &appsv1.DaemonSet{}
			case "v1/Pod":
				obj = &corev1.Pod{}
			default:
				t.Fatalf("%s #%d: kind %s %s has no check here", file, i, meta.APIVersion, meta.Kind)
			}
			if err := strict(doc, obj); err != nil {
				t.Errorf("%s #%d (%s): %v", file, i, meta.Kind, err)
			}
		}
	}
}

// TestStrictDecodingRefusesTypos: the check above can fail.
func TestStrictDecodingRefusesTypos(t *testing.T) {
	if err := strict([]byte(`{"apiVersion":"v1","kind":"Pod","spec":{"initContainer":[]}}`), &corev1.Pod{}); err == nil {
		t.Fatal("a misspelt field was accepted")
	}
}

func TestDaemonSet(t *testing.T) {
	var ds appsv1.DaemonSet
	if err := strict(documents(t)["daemonset.yaml"][0], &ds); err != nil {
		t.Fatal(err)
	}
	spec := ds.Spec.Template.Spec
	if !spec.HostNetwork || ds.Spec.Selector == nil || !labelsMatch(ds.Spec.Selector.MatchLabels, ds.Spec.Template.Labels) {
		t.Fatalf("want host network and a selector matching the template: %+v", ds.Spec)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Error("the installer talks to no API server: no service account token")
	}
	install := container(t, spec.Containers, "install")
	if !slices.Contains(install.Command, "install") || !slices.Contains(install.Command, "--chain") {
		t.Errorf("install container command: %q", install.Command)
	}
	if sc := install.SecurityContext; sc == nil || (sc.Privileged != nil && *sc.Privileged) {
		t.Error("the installer must not be privileged")
	}
	mounts := map[string]string{}
	for _, m := range install.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	// Each /host/X mount is the host's X.
	for path, name := range mounts {
		i := slices.IndexFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == name })
		if i < 0 || spec.Volumes[i].HostPath == nil || "/host"+spec.Volumes[i].HostPath.Path != path {
			t.Errorf("mount %s (volume %s) is not the host's directory", path, name)
		}
	}
	for _, flag := range []string{"--cni-bin-dir=/host/opt/cni/bin", "--cni-conf-dir=/host/etc/cni/net.d"} {
		if !slices.Contains(install.Command, flag) {
			t.Errorf("install container lacks %s", flag)
		}
		if _, ok := mounts[strings.SplitN(flag, "=", 2)[1]]; !ok {
			t.Errorf("%s is not mounted", flag)
		}
	}
	fp := container(t, spec.Containers, "fastpath")
	if fp.SecurityContext == nil || fp.SecurityContext.Privileged == nil || !*fp.SecurityContext.Privileged {
		t.Error("the fast path container needs privilege")
	}
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
