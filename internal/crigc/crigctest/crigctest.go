// Package crigctest is a container runtime for the tests of the GC against
// a runtime's sandbox list: a CRI RuntimeService that lists sandboxes and
// nothing else, served over a unix socket with grpc, as containerd serves
// its CRI.
package crigctest

import (
	"context"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Runtime answers ListPodSandbox with IDs (every second one NOTREADY: a
// sandbox stopped but still the runtime's), or with ListFail, and
// remembers when it was asked. Set its fields before Serve.
type Runtime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	IDs      []string
	ListFail error

	mu      sync.Mutex
	askedAt []time.Time
}

// ListPodSandbox is the CRI's sandbox list.
func (f *Runtime) ListPodSandbox(context.Context, *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.askedAt = append(f.askedAt, time.Now())
	if f.ListFail != nil {
		return nil, f.ListFail
	}
	r := &runtimeapi.ListPodSandboxResponse{}
	for i, id := range f.IDs {
		st := runtimeapi.PodSandboxState_SANDBOX_READY
		if i%2 == 1 {
			st = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
		}
		r.Items = append(r.Items, &runtimeapi.PodSandbox{Id: id, State: st, Metadata: &runtimeapi.PodSandboxMetadata{Name: "pod-" + id}})
	}
	return r, nil
}

// AskedAt is when the sandboxes were listed, in order.
func (f *Runtime) AskedAt() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.askedAt...)
}

// Serve serves f on a unix socket in a temporary directory until the test
// ends, and returns the socket's path.
func Serve(t testing.TB, f *Runtime) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(s, f)
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
	return sock
}
