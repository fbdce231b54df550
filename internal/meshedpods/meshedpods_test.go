package meshedpods

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/meshwire/meshwire/internal/recordfile"
)

// TestCallsKeptUntilDEL: a call written is listed whole and Exists; a
// write cut short (a temporary file) is not a call, and the DEL's Remove
// takes it with the call.
func TestCallsKeptUntilDEL(t *testing.T) {
	dir := t.TempDir()
	c := Call{ContainerID: "c/1", Netns: "/var/run/netns/cni-1", IfName: "eth0", Args: "K8S_POD_NAME=p", Config: []byte(`{"type":"intercept"}`)}
	if err := Write(dir, c); err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(dir, recordfile.TmpPrefix(c.Name())+"7")
	if err := os.WriteFile(cut, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := List(dir)
	if err != nil || len(got) != 1 || got[0].Netns != c.Netns || string(got[0].Config) != string(c.Config) || got[0].Args != c.Args {
		t.Fatalf("List: %+v, %v", got, err)
	}
	if !Exists(dir, "c/1", "eth0") || Exists(dir, "c/1", "net1") {
		t.Fatal("Exists names the wrong attachment")
	}
	if err := Remove(dir, "c/1", "eth0"); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("left after Remove: %v", entries)
	}
	if err := Remove(dir, "c/1", "eth0"); err != nil {
		t.Fatalf("a second Remove: %v", err)
	}
	if got, err := List(filepath.Join(dir, "none")); err != nil || len(got) != 0 {
		t.Fatalf("List of a missing directory: %v, %v", got, err)
	}
}
