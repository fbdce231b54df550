// Package capture loads, attaches, pins, upgrades and reports meshwire's
// netfilter-free interception (the "ebpf" mode; the programs are in
// capture.c, see its header). Attach puts connect4/6, sendmsg4/6,
// recvmsg4/6, getpeername4/6, sockops and getsockopt on the cgroup v2 root
// and pins their links, the maps and
// the inbound tc program under the pin directory, so that they outlive the
// command; pods are registered by the intercept plugin (package pods).
// `meshwire fastpath attach` attaches them with the fast path.
package capture

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/meshwire/meshwire/ebpf/capture/pods"
	"github.com/meshwire/meshwire/ebpf/loader"
)

// DefaultPinDir is where Attach pins, under bpffs.
const DefaultPinDir = loader.CapturePinDir

// hook is one cgroup attachment, pinned as its link.
type hook struct {
	pin    string
	attach ebpf.AttachType
	prog   func(*bpfObjects) *ebpf.Program
}

// hooks in attach order: what answers (sockops files original
// destinations, getsockopt, recvmsg and getpeername answer) before what
// redirects; connect4's link, pinned last, is what "attached" means.
var hooks = []hook{
	{"sockops_link", ebpf.AttachCGroupSockOps, func(o *bpfObjects) *ebpf.Program { return o.MwCapOps }},
	{"getsockopt_link", ebpf.AttachCGroupGetsockopt, func(o *bpfObjects) *ebpf.Program { return o.MwGetsockopt }},
	{"getpeername4_link", ebpf.AttachCgroupInet4GetPeername, func(o *bpfObjects) *ebpf.Program { return o.MwGetpeername4 }},
	{"getpeername6_link", ebpf.AttachCgroupInet6GetPeername, func(o *bpfObjects) *ebpf.Program { return o.MwGetpeername6 }},
	{"recvmsg6_link", ebpf.AttachCGroupUDP6Recvmsg, func(o *bpfObjects) *ebpf.Program { return o.MwRecvmsg6 }},
	{loader.PinDNSHook, ebpf.AttachCGroupUDP4Recvmsg, func(o *bpfObjects) *ebpf.Program { return o.MwRecvmsg4 }},
	{"sendmsg6_link", ebpf.AttachCGroupUDP6Sendmsg, func(o *bpfObjects) *ebpf.Program { return o.MwSendmsg6 }},
	{"sendmsg4_link", ebpf.AttachCGroupUDP4Sendmsg, func(o *bpfObjects) *ebpf.Program { return o.MwSendmsg4 }},
	{"connect6_link", ebpf.AttachCGroupInet6Connect, func(o *bpfObjects) *ebpf.Program { return o.MwConnect6 }},
	{"connect4_link", ebpf.AttachCGroupInet4Connect, func(o *bpfObjects) *ebpf.Program { return o.MwConnect4 }},
}

// pinned maps, by pin name.
func pinnedMaps(o *bpfObjects) map[string]*ebpf.Map {
	return map[string]*ebpf.Map{
		loader.PinPods: o.MwCapPods, loader.PinPorts: o.MwCapPorts, loader.PinCIDRs: o.MwCapCidrs,
		loader.PinOrigDst: o.MwCapOrigdst, loader.PinCounters: o.MwCapCounters,
	}
}

// mapNames are the maps' names in the object, by pin name.
var mapNames = map[string]string{
	loader.PinPods: "mw_cap_pods", loader.PinPorts: "mw_cap_ports", loader.PinCIDRs: "mw_cap_cidrs",
	loader.PinOrigDst: "mw_cap_origdst", loader.PinCounters: "mw_cap_counters",
}

// Result is what Attach did.
type Result = loader.Result

// IsAttached reports whether the programs are attached at dir.
func IsAttached(dir string) bool {
	_, err := os.Stat(filepath.Join(pinDir(dir), hooks[len(hooks)-1].pin))
	return err == nil
}

func pinDir(dir string) string {
	if dir == "" {
		return DefaultPinDir
	}
	return dir
}

// Attach attaches the programs at the cgroup v2 directory cgroup (the
// cgroup2 mount when empty), pinned at dir. Attached already, it compares
// the programs' tags with this build's: the same, nothing changes; others
// (an upgrade), each link is updated in place to this build's program,
// which uses the pinned maps, so registered pods stay registered and no
// connection escapes capture in between.
func Attach(cgroup, dir string) (Result, error) {
	dir = pinDir(dir)
	l, err := loader.LockToAttach()
	if err != nil {
		return 0, err
	}
	defer l.Release()
	cg, err := loader.CgroupDir(cgroup)
	if err != nil {
		return 0, err
	}
	if other, ok := loader.OtherLayout(loader.CaptureRoot, dir, IsAttached); ok {
		return 0, fmt.Errorf("the ebpf interception programs of another layout are attached (%s, by another meshwire version): its pods are registered there; delete them, then detach it with that version's `meshwire fastpath detach`", other)
	}
	attached := IsAttached(dir)
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{}}
	if attached {
		for pin, name := range mapNames {
			m, err := ebpf.LoadPinnedMap(filepath.Join(dir, pin), nil)
			if err != nil {
				return 0, fmt.Errorf("open the pinned %s map: %w", pin, err)
			}
			defer m.Close()
			opts.MapReplacements[name] = m
		}
	}
	objs, err := load(opts)
	if err != nil {
		return 0, err
	}
	defer objs.Close()
	if attached {
		return upgrade(cg, dir, objs)
	}
	return loader.Attached, attachFresh(cg, dir, objs)
}

func load(opts *ebpf.CollectionOptions) (*bpfObjects, error) {
	spec, err := loadBpf()
	if err != nil {
		return nil, fmt.Errorf("read the capture programs' object: %w", err)
	}
	var objs bpfObjects
	if err := spec.LoadAndAssign(&objs, opts); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("%w: the kernel refused the ebpf interception programs (they need cgroup connect, getsockopt and sockops hooks, socket-local storage and bpf_sk_assign): %v", loader.ErrUnsupported, loader.FirstLines(fmt.Sprintf("%+v", ve), 3))
		}
		return nil, fmt.Errorf("%w: load the ebpf interception programs: %v", loader.ErrUnsupported, err)
	}
	return &objs, nil
}

func attachFresh(cg, dir string, objs *bpfObjects) error {
	// Pins of a half-finished attach (killed between pins) go first.
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove the pins of an earlier attach: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create the pin directory: %w", err)
	}
	done := false
	defer func() {
		if !done {
			_ = os.RemoveAll(dir)
		}
	}()
	for pin, m := range pinnedMaps(objs) {
		if err := m.Pin(filepath.Join(dir, pin)); err != nil {
			return fmt.Errorf("pin %s: %w", pin, err)
		}
	}
	if err := objs.MwCapIngress.Pin(filepath.Join(dir, loader.PinIngress)); err != nil {
		return fmt.Errorf("pin the inbound program: %w", err)
	}
	for _, h := range hooks {
		if err := attachHook(cg, dir, h, objs); err != nil {
			return err
		}
	}
	done = true
	return nil
}

// attachHook attaches one program at the cgroup cg and pins its link.
func attachHook(cg, dir string, h hook, objs *bpfObjects) error {
	l, err := link.AttachCgroup(link.CgroupOptions{Path: cg, Attach: h.attach, Program: h.prog(objs)})
	if err != nil {
		return fmt.Errorf("%w: attach %s to the cgroup %s: %v", loader.ErrUnsupported, h.attach, cg, err)
	}
	err = l.Pin(filepath.Join(dir, h.pin))
	l.Close()
	if err != nil {
		return fmt.Errorf("pin %s: %w", h.pin, err)
	}
	return nil
}

// upgrade moves the pinned links to objs' programs where their tags
// differ, attaches the hooks an older build did not have (the DNS ones),
// and pins objs' inbound program for pods registered from now on (pods
// already registered keep the program their filters hold).
func upgrade(cg, dir string, objs *bpfObjects) (Result, error) {
	result := loader.AlreadyAttached
	for _, h := range hooks {
		l, err := link.LoadPinnedLink(filepath.Join(dir, h.pin), nil)
		if errors.Is(err, os.ErrNotExist) {
			result = loader.Replaced
			if err := attachHook(cg, dir, h, objs); err != nil {
				return result, err
			}
			continue
		}
		if err != nil {
			return result, fmt.Errorf("open the pinned %s: %w", h.pin, err)
		}
		same, err := sameProgram(l, h.prog(objs))
		if err == nil && !same {
			result = loader.Replaced
			err = l.Update(h.prog(objs))
		}
		l.Close()
		if err != nil {
			return result, fmt.Errorf("replace the program of %s: %w", h.pin, err)
		}
	}
	if result == loader.Replaced {
		path := filepath.Join(dir, loader.PinIngress)
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return result, fmt.Errorf("unpin the previous inbound program: %w", err)
		}
		if err := objs.MwCapIngress.Pin(path); err != nil {
			return result, fmt.Errorf("pin the inbound program: %w", err)
		}
	}
	return result, nil
}

func sameProgram(l link.Link, p *ebpf.Program) (bool, error) {
	li, err := l.Info()
	if err != nil {
		return false, err
	}
	old, err := ebpf.NewProgramFromID(li.Program)
	if err != nil {
		return false, err
	}
	defer old.Close()
	a, err := old.Info()
	if err != nil {
		return false, err
	}
	b, err := p.Info()
	if err != nil {
		return false, err
	}
	return a.Tag == b.Tag, nil
}

// Detach removes the programs' links and every pin at dir. With pods
// registered it refuses unless force: their connections would stop going
// through their sidecars. Forced, the registrations are dropped first, so
// that the inbound filters still on the pods' interfaces let everything
// pass. Connections already established keep working.
func Detach(dir string, force bool) (bool, error) {
	dir = pinDir(dir)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	l, err := loader.Lock()
	if err != nil {
		return false, err
	}
	defer l.Release()
	if m, err := ebpf.LoadPinnedMap(filepath.Join(dir, loader.PinPods), nil); err == nil {
		keys, err := podKeys(m)
		if err == nil && len(keys) > 0 && !force {
			err = fmt.Errorf("%d pods use ebpf interception: detaching would send their connections past their sidecars (delete them first, or force)", len(keys))
		}
		for _, k := range keys {
			if err != nil {
				break
			}
			if derr := m.Delete(k); derr != nil && !errors.Is(derr, ebpf.ErrKeyNotExist) {
				err = derr
			}
		}
		m.Close()
		if err != nil {
			return true, err
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return true, fmt.Errorf("remove the pins in %s: %w", dir, err)
	}
	_ = os.Remove(filepath.Dir(dir)) // only when empty
	return true, nil
}

func podKeys(m *ebpf.Map) ([]uint64, error) {
	var keys []uint64
	var k uint64
	var v pods.Capture
	it := m.Iterate()
	for it.Next(&k, &v) {
		keys = append(keys, k)
	}
	return keys, it.Err()
}

// Status is what status reports.
type Status struct {
	Attached bool     `json:"attached"`
	PinDir   string   `json:"pin_dir"`
	Pods     int      `json:"pods"`
	Counters Counters `json:"counters"`
}

// counterCount is CC_MAX of capture.c's enum counter.
const counterCount = 5

// Counters are totals since attach.
type Counters struct {
	Outbound   uint64 `json:"outbound"`    // connections sent to the outbound port
	InboundLo  uint64 `json:"inbound_lo"`  // the proxy's connections to its pod, to the inbound port
	Inbound    uint64 `json:"inbound"`     // SYNs handed to the inbound listener
	NoListener uint64 `json:"no_listener"` // SYNs dropped: no inbound listener yet
	Answers    uint64 `json:"answers"`     // SO_ORIGINAL_DST answered
}

// ReadStatus reports whether the programs are attached at dir, with the
// registered pods and the counters.
func ReadStatus(dir string) (Status, error) {
	dir = pinDir(dir)
	st := Status{PinDir: dir}
	if !IsAttached(dir) {
		return st, nil
	}
	st.Attached = true
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, loader.PinPods), nil)
	if err != nil {
		return st, fmt.Errorf("open the pinned pods map: %w", err)
	}
	keys, err := podKeys(m)
	m.Close()
	if err != nil {
		return st, fmt.Errorf("walk the pods map: %w", err)
	}
	st.Pods = len(keys)
	sum, err := loader.SumCounters(filepath.Join(dir, loader.PinCounters), counterCount)
	if err != nil {
		return st, err
	}
	st.Counters = Counters{Outbound: sum[0], InboundLo: sum[1], Inbound: sum[2], NoListener: sum[3], Answers: sum[4]}
	return st, nil
}
