package podnetns

import (
	"testing"

	"github.com/prometheus/procfs"
)

// TestPodCgroup: the pod's cgroup as kubelet names it with the cgroupfs
// and systemd drivers, on cgroup v1 and v2, and the container's id below
// it.
func TestPodCgroup(t *testing.T) {
	const uid = "6f1c1f2e-93a4-4c55-9a57-8a1d2f3b4c5d"
	under := func(path string) []procfs.Cgroup {
		return []procfs.Cgroup{{HierarchyID: 4, Controllers: []string{"memory"}, Path: "/"}, {Path: path}}
	}
	for _, c := range []struct {
		path, container string
		ok              bool
	}{
		{"/kubepods/besteffort/pod" + uid + "/0123abcd", "0123abcd", true},
		{"/kubepods/pod" + uid + "/0123abcd", "0123abcd", true},
		{"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod6f1c1f2e_93a4_4c55_9a57_8a1d2f3b4c5d.slice/cri-containerd-0123abcd.scope", "0123abcd", true},
		{"/kubepods.slice/kubepods-pod6f1c1f2e_93a4_4c55_9a57_8a1d2f3b4c5d.slice/crio-0123abcd.scope", "0123abcd", true},
		{"/kubepods/besteffort/pod" + uid, "", true},
		{"/kubepods/besteffort/pod" + uid + "0/0123abcd", "", false},
		{"/kubepods/besteffort/podother/0123abcd", "", false},
		{"/user.slice/user-0.slice/session-1.scope", "", false},
	} {
		got, ok := podCgroup(under(c.path), uid)
		if ok != c.ok || got != c.container {
			t.Errorf("%s: %q %v, want %q %v", c.path, got, ok, c.container, c.ok)
		}
	}
}
