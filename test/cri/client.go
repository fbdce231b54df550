package cri

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// PodSpec is what kubelet gives RunPodSandbox of a pod.
type PodSpec struct {
	Name, Namespace string
	Labels          map[string]string
	// Annotations reach the CNI plugins that declare the
	// io.kubernetes.cri.pod-annotations capability; containerd turns
	// kubernetes.io/ingress-bandwidth and egress-bandwidth into the
	// bandwidth capability.
	Annotations map[string]string
	// PortMappings (hostPort of the pod's containers) reach the plugins
	// declaring the portMappings capability.
	PortMappings []*runtimeapi.PortMapping
}

// Pod is a running pod sandbox.
type Pod struct {
	c      *Containerd
	ID     string
	Config *runtimeapi.PodSandboxConfig
}

// RunPod runs a pod sandbox as kubelet does; containerd sets its network up
// with the conflist before it returns. The pod is removed at cleanup if the
// test has not removed it.
func (c *Containerd) RunPod(spec PodSpec) *Pod {
	c.T.Helper()
	p, err := c.RunPodE(spec)
	if err != nil {
		c.T.Fatalf("RunPodSandbox %s/%s: %v", spec.Namespace, spec.Name, err)
	}
	return p
}

// RunPodE is RunPod returning the error.
func (c *Containerd) RunPodE(spec PodSpec) (*Pod, error) {
	uid := randomHex(16)
	logDir := filepath.Join(c.Dir, "pods", spec.Namespace+"_"+spec.Name+"_"+uid)
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	cfg := &runtimeapi.PodSandboxConfig{
		Metadata:     &runtimeapi.PodSandboxMetadata{Name: spec.Name, Namespace: spec.Namespace, Uid: uid},
		Hostname:     spec.Name,
		LogDirectory: logDir,
		Labels:       spec.Labels,
		Annotations:  spec.Annotations,
		PortMappings: spec.PortMappings,
		Linux:        &runtimeapi.LinuxPodSandboxConfig{CgroupParent: c.cgroupParent},
	}
	ctx, cancel := Ctx()
	defer cancel()
	resp, err := c.Runtime.RunPodSandbox(ctx, &runtimeapi.RunPodSandboxRequest{Config: cfg})
	if err != nil {
		return nil, err
	}
	p := &Pod{c: c, ID: resp.PodSandboxId, Config: cfg}
	c.remember(c.ids, p.ID)
	// Remembered for cleanup after a failure (a /proc path goes with
	// the sandbox's process).
	if path, err := p.NetNSE(); err == nil && !strings.HasPrefix(path, "/proc/") {
		c.remember(c.netns, path)
	}
	return p, nil
}

// Status returns the pod's verbose status.
func (p *Pod) Status() *runtimeapi.PodSandboxStatusResponse {
	p.c.T.Helper()
	ctx, cancel := Ctx()
	defer cancel()
	st, err := p.c.Runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: p.ID, Verbose: true})
	if err != nil {
		p.c.T.Fatalf("PodSandboxStatus %s: %v", p.ID, err)
	}
	return st
}

// IP is the pod's IP as CRI reports it (the first address of the CNI
// result).
func (p *Pod) IP() string {
	p.c.T.Helper()
	ip := p.Status().GetStatus().GetNetwork().GetIp()
	if ip == "" {
		p.c.T.Fatalf("pod %s has no IP", p.Config.Metadata.Name)
	}
	return ip
}

// NetNS returns the path of the pod's network namespace.
func (p *Pod) NetNS() string {
	p.c.T.Helper()
	path, err := p.NetNSE()
	if err != nil {
		p.c.T.Fatalf("network namespace of pod %s: %v", p.Config.Metadata.Name, err)
	}
	return path
}

// sandboxInfo is the part of containerd's verbose sandbox info read here.
type sandboxInfo struct {
	Pid         int `json:"pid"`
	RuntimeSpec struct {
		Linux struct {
			Namespaces []struct {
				Type string `json:"type"`
				Path string `json:"path"`
			} `json:"namespaces"`
		} `json:"linux"`
	} `json:"runtimeSpec"`
}

// NetNSE returns the path of the pod's network namespace: the network
// namespace of the sandbox's OCI spec (a file containerd mounted under
// /var/run/netns) from the verbose status, else the sandbox task's
// /proc/<pid>/ns/net.
func (p *Pod) NetNSE() (string, error) {
	ctx, cancel := Ctx()
	defer cancel()
	st, err := p.c.Runtime.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: p.ID, Verbose: true})
	if err != nil {
		return "", err
	}
	raw, ok := st.GetInfo()["info"]
	if !ok {
		return "", fmt.Errorf("no verbose info in the status")
	}
	var info sandboxInfo
	if err := json.Unmarshal([]byte(raw), &info); err != nil {
		return "", fmt.Errorf("verbose info: %w", err)
	}
	for _, ns := range info.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" && ns.Path != "" {
			return ns.Path, nil
		}
	}
	if info.Pid > 0 {
		return fmt.Sprintf("/proc/%d/ns/net", info.Pid), nil
	}
	return "", fmt.Errorf("neither a network namespace path nor a pid in the verbose info")
}

// Remove stops and removes the pod (containerd runs the plugins' DEL).
func (p *Pod) Remove() error { return p.c.RemovePod(p.ID) }

// RemovePod stops and removes a pod sandbox by id, as kubelet does.
func (c *Containerd) RemovePod(id string) error {
	ctx, cancel := Ctx()
	defer cancel()
	_, err := c.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
	if err != nil && c.dropTruncatedCNICache(id) {
		_, err = c.Runtime.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: id})
	}
	if err != nil {
		return fmt.Errorf("StopPodSandbox %s: %w", id, err)
	}
	if _, err := c.Runtime.RemovePodSandbox(ctx, &runtimeapi.RemovePodSandboxRequest{PodSandboxId: id}); err != nil {
		return fmt.Errorf("RemovePodSandbox %s: %w", id, err)
	}
	return nil
}

// cniResultsDir is where containerd's libcni caches each attachment's
// result (go-cni's default cache directory, /var/lib/cni).
const cniResultsDir = "/var/lib/cni/results"

// dropTruncatedCNICache removes the cached results of sandbox id that are
// not JSON, and reports whether it removed any. containerd 1.6's libcni
// writes that cache in place, so containerd killed during the write
// leaves a truncated file, and every StopPodSandbox of the pod then fails
// before any plugin runs ("failed to get network ... cached result:
// unexpected end of JSON input"). Without the file containerd runs the
// DEL from the configuration, as an operator's fix would have it; the
// plugins must then clean up with no previous result.
func (c *Containerd) dropTruncatedCNICache(id string) bool {
	files, _ := filepath.Glob(filepath.Join(cniResultsDir, "*-"+id+"-*"))
	dropped := false
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil || json.Valid(b) {
			continue
		}
		if err := os.Remove(f); err == nil {
			c.T.Logf("pod %s: containerd's cached CNI result %s is truncated (%d bytes; containerd was killed writing it): removed, so that StopPodSandbox runs the DEL from the configuration", id, f, len(b))
			dropped = true
		}
	}
	return dropped
}

// ContainerSpec is a container of Image.
type ContainerSpec struct {
	Name    string
	Command []string
	// RunAsUser and RunAsGroup, when not nil, set the process's ids (a
	// sidecar proxy runs as 1337).
	RunAsUser, RunAsGroup *int64
}

// Container is a started container.
type Container struct {
	Pod *Pod
	ID  string
}

// StartContainer creates and starts a container in the pod and waits until
// CRI reports it running.
func (p *Pod) StartContainer(spec ContainerSpec) *Container {
	c := p.c
	c.T.Helper()
	sc := &runtimeapi.LinuxContainerSecurityContext{}
	if spec.RunAsUser != nil {
		sc.RunAsUser = &runtimeapi.Int64Value{Value: *spec.RunAsUser}
	}
	if spec.RunAsGroup != nil {
		sc.RunAsGroup = &runtimeapi.Int64Value{Value: *spec.RunAsGroup}
	}
	cfg := &runtimeapi.ContainerConfig{
		Metadata: &runtimeapi.ContainerMetadata{Name: spec.Name},
		Image:    &runtimeapi.ImageSpec{Image: Image},
		Command:  spec.Command,
		LogPath:  spec.Name + ".log",
		Linux:    &runtimeapi.LinuxContainerConfig{SecurityContext: sc},
	}
	ctx, cancel := Ctx()
	defer cancel()
	created, err := c.Runtime.CreateContainer(ctx, &runtimeapi.CreateContainerRequest{PodSandboxId: p.ID, Config: cfg, SandboxConfig: p.Config})
	if err != nil {
		c.T.Fatalf("CreateContainer %s in %s: %v", spec.Name, p.Config.Metadata.Name, err)
	}
	c.remember(c.ids, created.ContainerId)
	if _, err := c.Runtime.StartContainer(ctx, &runtimeapi.StartContainerRequest{ContainerId: created.ContainerId}); err != nil {
		c.T.Fatalf("StartContainer %s in %s: %v", spec.Name, p.Config.Metadata.Name, err)
	}
	ct := &Container{Pod: p, ID: created.ContainerId}
	for deadline := time.Now().Add(startTimeout); ; {
		st, err := c.Runtime.ContainerStatus(ctx, &runtimeapi.ContainerStatusRequest{ContainerId: ct.ID})
		if err != nil {
			c.T.Fatalf("ContainerStatus %s: %v", spec.Name, err)
		}
		switch state := st.GetStatus().GetState(); state {
		case runtimeapi.ContainerState_CONTAINER_RUNNING:
			return ct
		case runtimeapi.ContainerState_CONTAINER_EXITED:
			c.T.Fatalf("container %s exited (code %d, %s)", spec.Name, st.GetStatus().GetExitCode(), st.GetStatus().GetMessage())
		}
		if time.Now().After(deadline) {
			c.T.Fatalf("container %s not running after %s", spec.Name, startTimeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Exec runs a command in the container (CRI ExecSync) with a timeout in
// seconds and returns its output and exit code.
func (ct *Container) Exec(timeout time.Duration, cmd ...string) (stdout, stderr string, code int32, err error) {
	ctx, cancel := Ctx()
	defer cancel()
	resp, err := ct.Pod.c.Runtime.ExecSync(ctx, &runtimeapi.ExecSyncRequest{ContainerId: ct.ID, Cmd: cmd, Timeout: int64(timeout / time.Second)})
	if err != nil {
		return "", "", -1, err
	}
	return string(resp.Stdout), string(resp.Stderr), resp.ExitCode, nil
}

// Int64 is a pointer to v, for ContainerSpec's ids.
func Int64(v int64) *int64 { return &v }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// remember adds key to one of c's sets of things to clean up.
func (c *Containerd) remember(set map[string]bool, key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	set[key] = true
}
