//go:build kernel

package fastpath

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"

	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/ebpf/loader"
	"github.com/meshwire/meshwire/internal/kerneltest"
)

// otherBuild loads this build's spec with one instruction more at the start
// of the sockops program (r0 = 0, which the program overwrites before it
// returns): what the kernel sees of a build whose programs differ, with the
// same maps and layout.
func otherBuild() (*ebpf.CollectionSpec, error) {
	spec, err := loadBpf()
	if err != nil {
		return nil, err
	}
	p := spec.Programs["mw_sockops"]
	first := p.Instructions[0]
	extra := asm.Mov.Imm(asm.R0, 0)
	extra.Metadata, first.Metadata = first.Metadata, asm.Metadata{} // the symbol and BTF func info stay at the start
	p.Instructions = append(asm.Instructions{extra, first}, p.Instructions[1:]...)
	return spec, nil
}

// liveSockhashes counts the kernel's fast-path sockhashes.
func liveSockhashes(t *testing.T) int {
	t.Helper()
	n, err := Sockhashes()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestAttachReplacesOtherBuild: attach over a fast path of another build
// (same layout and settings, other programs) replaces it with this build's
// programs, and the other build's maps go with it; attach over this
// build's changes nothing; a downgrade replaces too.
func TestAttachReplacesOtherBuild(t *testing.T) {
	kerneltest.Require(t)
	if IsAttached(DefaultPinDir) {
		t.Fatalf("a fast path is attached at %s before the test", DefaultPinDir)
	}
	cfg := Defaults()
	cfg.PinDir = filepath.Join(loader.BPFFS, "mwt-upgrade")
	t.Cleanup(func() { _, _ = Detach(cfg.PinDir) })

	this, err := load(cfg, loadBpf)
	if err != nil {
		t.Fatal(err)
	}
	defer this.Close()
	other, err := load(cfg, otherBuild)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	tagsOf := func(o *bpfObjects) tags {
		si, err1 := o.MwSockops.Info()
		mi, err2 := o.MwMsg.Info()
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		return tags{si.Tag, mi.Tag}
	}
	thisTags, otherTags := tagsOf(this), tagsOf(other)
	if thisTags.sockops == otherTags.sockops {
		t.Fatalf("the other build's sockops program has this build's tag %s: the test proves nothing", thisTags.sockops)
	}
	before := liveSockhashes(t) // this and other, loaded above

	step := func(name string, load func() (*ebpf.CollectionSpec, error), want loader.Result, wantTags tags) {
		t.Helper()
		res, err := attach(cfg, load)
		if err != nil || res != want {
			t.Fatalf("%s: %v, %v; want result %v", name, res, err, want)
		}
		got, err := attachedTags(cfg.PinDir)
		if err != nil {
			t.Fatal(err)
		}
		if got != wantTags {
			t.Fatalf("%s: attached programs %+v, want %+v", name, got, wantTags)
		}
		// The kernel frees a map after its last reference, in the
		// background.
		n := 0
		for end := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if n = liveSockhashes(t) - before; n == 1 || time.Now().After(end) {
				break
			}
		}
		if n != 1 {
			t.Fatalf("%s: %d fast-path sockhashes attached, want 1 (a replaced build's maps must go with it)", name, n)
		}
	}
	step("first attach, the other build", otherBuild, loader.Attached, otherTags)
	// A meshed pod's policy, written at its ADD, survives the upgrade.
	pods, err := ebpf.LoadPinnedMap(filepath.Join(cfg.PinDir, pinPods), nil)
	if err != nil {
		t.Fatal(err)
	}
	const cookie = uint64(0x6d77)
	err = pods.Put(cookie, podpolicy.Value{Flags: podpolicy.FlagIntoProxy})
	pods.Close()
	if err != nil {
		t.Fatal(err)
	}
	step("attach, this build over the other", loadBpf, loader.Replaced, thisTags)
	if kept, err := readPodPolicies(cfg.PinDir); err != nil || len(kept) != 1 || kept[cookie].Flags != podpolicy.FlagIntoProxy {
		t.Fatalf("pod policies after the upgrade: %v, %v; want the one written before", kept, err)
	}
	step("attach again", loadBpf, loader.AlreadyAttached, thisTags)
	step("the other build over this one", otherBuild, loader.Replaced, otherTags)

	d, err := Detach(cfg.PinDir)
	if err != nil || !d.WasAttached {
		t.Fatalf("detach: %+v %v", d, err)
	}
	if _, err := os.Stat(cfg.PinDir); !os.IsNotExist(err) {
		t.Fatalf("pins left: %v", err)
	}
}

// TestOtherSockops: a sockops program of another tool attached at the
// cgroup is listed, with its name and tag; meshwire's own is not. The
// programs go on a throwaway child cgroup, not the node's root.
func TestOtherSockops(t *testing.T) {
	kerneltest.Require(t)
	root, err := loader.Cgroup2Root()
	if err != nil {
		t.Fatal(err)
	}
	cg := filepath.Join(root, fmt.Sprintf("mwt-sockops-%d", os.Getpid()))
	if err := os.Mkdir(cg, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(cg) })

	if _, others, err := OtherSockops(cg); err != nil || len(others) != 0 {
		t.Fatalf("an empty cgroup: %v, %v", others, err)
	}
	ours, err := load(Defaults(), loadBpf)
	if err != nil {
		t.Fatal(err)
	}
	defer ours.Close()
	other, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "other_tool", Type: ebpf.SockOps, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 1), asm.Return()},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	for _, p := range []*ebpf.Program{ours.MwSockops, other} {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cg, Attach: ebpf.AttachCGroupSockOps, Program: p})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
	}
	info, err := other.Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	dir, others, err := OtherSockops(cg)
	if err != nil {
		t.Fatal(err)
	}
	if dir != cg || len(others) != 1 || others[0] != (Program{ID: uint32(id), Name: "other_tool", Tag: info.Tag}) {
		t.Fatalf("OtherSockops(%s) = %s, %+v; want only the other tool's program %d", cg, dir, others, id)
	}
}

// TestReplaceRefusedBesideOtherLayout: over another build's fast path, with
// a fast path of another layout pinned beside it, attach is refused and the
// other build's stays attached: nothing is detached before the refusal.
func TestReplaceRefusedBesideOtherLayout(t *testing.T) {
	kerneltest.Require(t)
	if IsAttached(DefaultPinDir) {
		t.Fatalf("a fast path is attached at %s before the test", DefaultPinDir)
	}
	cfg := Defaults()
	t.Cleanup(func() { _, _ = Detach(cfg.PinDir) })
	if res, err := attach(cfg, otherBuild); err != nil || res != loader.Attached {
		t.Fatalf("attach the other build: %v, %v", res, err)
	}
	before, err := attachedTags(cfg.PinDir)
	if err != nil {
		t.Fatal(err)
	}
	// Another layout's, attached where its own check let it (outside the
	// layouts' directory), then moved beside this one's.
	older := filepath.Join(loader.FastpathRoot, "v1")
	elsewhere := Defaults()
	elsewhere.PinDir = filepath.Join(loader.BPFFS, "mwt-older")
	t.Cleanup(func() { _, _ = Detach(older); _, _ = Detach(elsewhere.PinDir) })
	if _, err := Attach(elsewhere); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(elsewhere.PinDir, older); err != nil {
		t.Fatal(err)
	}
	if _, err := Attach(cfg); err == nil || !strings.Contains(err.Error(), "another layout") {
		t.Fatalf("attach beside another layout: %v, want refused", err)
	}
	if after, err := attachedTags(cfg.PinDir); err != nil || after != before {
		t.Fatalf("the refused attach changed what was attached: %+v, %v; was %+v", after, err, before)
	}
}
