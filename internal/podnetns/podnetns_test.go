package podnetns

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestRecordRoundTrip(t *testing.T) {
	dir := t.TempDir()
	p := Pod{ContainerID: "c1", IfName: "eth0", Netns: "/proc/self/ns/net", UID: "u1", Namespace: "ns", Name: "app",
		IPs: []netip.Addr{netip.MustParseAddr("10.0.0.5")}, Annotations: IstioAnnotations(map[string]string{
			"istio.io/dataplane-mode": "ambient", "kubectl.kubernetes.io/last-applied-configuration": "{...}"})}
	if err := Write(dir, p); err != nil {
		t.Fatal(err)
	}
	got, ok, err := Read(dir, p.Record())
	if err != nil || !ok {
		t.Fatalf("Read: %v %v", ok, err)
	}
	if got.NetnsIno == 0 || got.Key() != "ns/app" || len(got.Annotations) != 1 || got.IPs[0] != p.IPs[0] {
		t.Fatalf("read back %+v", got)
	}
	// The test's own namespace is not a pod's.
	if err := got.Check(); err == nil {
		t.Fatal("Check accepted the process's own namespace")
	}
	if err := Remove(dir, "c1", "eth0"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := Read(dir, p.Record()); ok || err != nil {
		t.Fatalf("after Remove: %v %v", ok, err)
	}
	for _, bad := range []string{"", "../x", ".tmp-a", "a/b"} {
		if _, _, err := Read(dir, bad); err == nil {
			t.Errorf("Read(%q) accepted", bad)
		}
	}
}

func TestAskServe(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := Ask(ctx, sock, "x"); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("no agent: %v", err)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	go Serve(ctx, ln, func(_ context.Context, name string) (string, error) {
		if name == "bad" {
			return "", errors.New("no ztunnel\nconnected")
		}
		return AnswerEnrolled + " " + name, nil
	})
	actx, acancel := context.WithTimeout(ctx, 5*time.Second)
	defer acancel()
	if a, err := Ask(actx, sock, "c1-eth0"); err != nil || a != "enrolled c1-eth0" {
		t.Fatalf("answer %q, %v", a, err)
	}
	if _, err := Ask(actx, sock, "bad"); err == nil || !strings.Contains(err.Error(), "no ztunnel; connected") {
		t.Fatalf("error answer: %v", err)
	}
}
