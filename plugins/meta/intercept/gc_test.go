package main

import (
	"testing"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/podstate"
)

// TestGCRecords: GC removes the records of this network's attachments
// the runtime no longer names, and keeps those it names and every other
// network's.
func TestGCRecords(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(nodelayout.EnvNodeStateDir, dir)
	store := podstate.New(nodelayout.At(dir))
	for _, r := range []podstate.Record{
		{ContainerID: "kept", IfName: "eth0", Network: "mesh", Call: &podstate.Call{}},
		{ContainerID: "gone", IfName: "eth0", Network: "mesh", Call: &podstate.Call{}},
		{ContainerID: "gone", IfName: "net1", Network: "other", Call: &podstate.Call{}},
	} {
		if err := store.Put(r); err != nil {
			t.Fatal(err)
		}
	}
	stdin := conf(`"cni.dev/valid-attachments":[{"containerID":"kept","ifname":"eth0"}]`)
	if err := cmdGC(&skel.CmdArgs{StdinData: stdin}); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]bool{podstate.Name("kept", "eth0"): true, podstate.Name("gone", "eth0"): false, podstate.Name("gone", "net1"): true} {
		if store.Exists(name) != want {
			t.Errorf("record %s: there %v, want %v", name, !want, want)
		}
	}
}
