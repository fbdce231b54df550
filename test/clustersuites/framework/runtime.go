package framework

import (
	"bufio"
	"context"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Sandbox is one pod sandbox as the node's runtime lists it: what a node
// has without the API server.
type Sandbox struct {
	ID, Pod string
	Ready   bool   // the runtime's SANDBOX_READY: its network was set up
	IP      string // the address the CNI result gave it
}

// Sandboxes lists the pod sandboxes of namespace ns on node n over CRI
// (the node's containerd socket), as kubelet would, with each one's
// address.
func (n Node) Sandboxes(ctx context.Context, ns string) ([]Sandbox, error) {
	conn, err := grpc.NewClient("unix://"+n.CRISocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	rt := runtimeapi.NewRuntimeServiceClient(conn)
	l, err := rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		LabelSelector: map[string]string{"io.kubernetes.pod.namespace": ns}}})
	if err != nil {
		return nil, err
	}
	var out []Sandbox
	for _, sb := range l.Items {
		s := Sandbox{ID: sb.Id, Pod: sb.Metadata.GetName(), Ready: sb.State == runtimeapi.PodSandboxState_SANDBOX_READY}
		if st, err := rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: sb.Id}); err == nil {
			s.IP = st.GetStatus().GetNetwork().GetIp()
		}
		out = append(out, s)
	}
	return out, nil
}

// SandboxCall is one RunPodSandbox of the node's containerd, from its log:
// when it began and ended, and whether it failed (its error).
type SandboxCall struct {
	Pod        string
	Start, End time.Time
	Err        string
}

var (
	runSandboxLine = regexp.MustCompile(`^time="([^"]+)".* msg="RunPodSandbox for &PodSandboxMetadata\{Name:([^,]+),Uid:[^,]*,Namespace:([^,]+),Attempt:(\d+),\}(.*)$`)
	sandboxFailed  = regexp.MustCompile(`failed, error" error="(.*)"`)
)

// SandboxCalls reads the RunPodSandbox calls for namespace ns from the
// node's containerd log, in the order they began; a call still running
// has a zero End.
func (n Node) SandboxCalls(ns string) ([]SandboxCall, error) {
	f, err := os.Open(n.RuntimeLog)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseSandboxCalls(f, ns)
}

func parseSandboxCalls(r io.Reader, ns string) ([]SandboxCall, error) {
	var calls []SandboxCall
	open := map[string]int{} // pod/attempt -> index in calls
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := runSandboxLine.FindStringSubmatch(sc.Text())
		if m == nil || m[3] != ns {
			continue
		}
		at, err := time.Parse(time.RFC3339Nano, m[1])
		if err != nil {
			continue
		}
		key, rest := m[2]+"/"+m[4], m[5]
		i, running := open[key]
		switch {
		case strings.HasPrefix(rest, " returns sandbox id"):
			if running {
				calls[i].End = at
				delete(open, key)
			}
		case strings.HasPrefix(rest, " failed, error"):
			if running {
				calls[i].End, calls[i].Err = at, "failed"
				if e := sandboxFailed.FindStringSubmatch(rest); e != nil && e[1] != "" {
					calls[i].Err = e[1]
				}
				delete(open, key)
			}
		case strings.HasPrefix(rest, `"`):
			open[key] = len(calls)
			calls = append(calls, SandboxCall{Pod: m[2], Start: at})
		}
	}
	return calls, sc.Err()
}
