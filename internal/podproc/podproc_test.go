package podproc

import (
	"testing"

	"github.com/prometheus/procfs"
)

// TestOfPod: a process is the pod's when a cgroup of its is named after
// the pod's uid, as kubelet names it with the cgroupfs and systemd drivers
// on cgroup v1 and v2, or after one of the pod's containers (no pod
// cgroups); its container id is its own cgroup's name.
func TestOfPod(t *testing.T) {
	const uid = "6f1c1f2e-93a4-4c55-9a57-8a1d2f3b4c5d"
	const systemdPod = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod6f1c1f2e_93a4_4c55_9a57_8a1d2f3b4c5d.slice"
	containers := []string{"c0ffee01", "c0ffee02"}
	in := func(path string) []procfs.Cgroup {
		return []procfs.Cgroup{{HierarchyID: 4, Controllers: []string{"memory"}, Path: "/v1" + path}, {HierarchyID: 0, Path: path}}
	}
	for _, c := range []struct {
		path, container string
		ok              bool
	}{
		{"/kubepods/besteffort/pod" + uid + "/0123abcd", "0123abcd", true},
		{"/kubepods/pod" + uid + "/0123abcd", "0123abcd", true},
		{systemdPod + "/cri-containerd-0123abcd.scope", "0123abcd", true},
		{"/kubepods.slice/kubepods-pod6f1c1f2e_93a4_4c55_9a57_8a1d2f3b4c5d.slice/crio-0123abcd.scope", "0123abcd", true},
		{"/k8s.io/c0ffee02", "c0ffee02", true},
		{"/system.slice/cri-containerd-c0ffee01.scope", "c0ffee01", true},
		{"/k8s.io/c0ffee03", "c0ffee03", false},
		{"/kubepods/besteffort/pod" + uid + "0/0123abcd", "0123abcd", false},
		{"/kubepods/besteffort/podother/0123abcd", "0123abcd", false},
		{"/user.slice/user-0.slice/session-1.scope", "1", false},
	} {
		cgroups := in(c.path)
		if ok := ofPod(cgroups, uid, containers); ok != c.ok {
			t.Errorf("%s: the pod's %v, want %v", c.path, ok, c.ok)
		}
		if got := leaf(cgroups); got != c.container {
			t.Errorf("%s: container %q, want %q", c.path, got, c.container)
		}
	}
}
