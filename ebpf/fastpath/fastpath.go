// Package fastpath loads, attaches, pins, drains and reports meshwire's eBPF
// sockmap fast path (the programs are in ../fastpath.c; see its header for how
// connections are chosen and paired). `meshwire fastpath` drives it.
//
// Attach loads the programs, attaches sk_msg to the sockhash and sockops to
// the cgroup v2 root, and pins the sockops link and the maps status and
// detach need under PinDir, so that the fast path outlives the command.
// Detach turns the programs into pass-through (draining), removes the
// sockops attachment and every pin; sockets already on the fast path keep
// it until they close, with the bytes it queued for them, and nothing in
// user space needs to stay behind: each socket's psock holds the sk_msg
// program, which holds the sockhash it redirects through, so the kernel
// keeps the sockhash while any socket is in it and frees it after the last
// one closes (TestFastpathDetachKeepsQueuedBytes).
package fastpath

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/ebpf/capture/pods"
	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/internal/filelock"
)

// LayoutVersion names the layout of the pinned objects; a program or map
// change that an older meshwire could not read bumps it.
const LayoutVersion = podpolicy.LayoutVersion

// DefaultPinDir is where Attach pins, under bpffs.
const DefaultPinDir = podpolicy.DefaultPinDir

// bpffs is where bpffs is mounted when absent.
const bpffs = "/sys/fs/bpf"

// lockDir serializes attach and detach on the node: an flock on the bpffs
// mount itself, which the host and a DaemonSet's container (with the
// host's /sys/fs/bpf mounted) share, as they share the pins; a file under
// /run is not shared. Nothing removes it.
var lockDir = bpffs

func lock() (*filelock.Lock, error) { return filelock.AcquireDir(lockDir, 30*time.Second) }

// Lock takes the node-wide lock attach and detach hold, for the other BPF
// programs meshwire attaches beside the fast path (package capture).
func Lock() (*filelock.Lock, error) { return lock() }

// captureSockopsName is the sockops program of meshwire's ebpf
// interception (../capture.c), attached beside the fast path's: it only
// files original destinations, never redirects.
const captureSockopsName = "mw_cap_ops"

// Names of the pinned objects, under the pin directory.
const (
	pinLink     = "sockops_link"
	pinSocks    = "socks"
	pinCounters = "counters"
	pinControl  = "control"
	pinPods     = podpolicy.PinName
)

// Config is what attach is given.
type Config struct {
	ProxyUID uint32 // the sidecar's uid (iptables-init's --proxy-uid)
	// ProxyGID, when set, makes sockets of that gid the sidecar's too
	// (iptables-init's --proxy-gid), whatever their uid.
	ProxyGID     *uint32
	OutboundPort uint16 // the sidecar's outbound capture port
	IntoProxy    bool   // also redirect the app's bytes into the proxy's sockets
	PinDir       string // default DefaultPinDir
	Cgroup       string // cgroup v2 directory; default: the cgroup2 mount
}

// Defaults are istio's: uid 1337, outbound capture on 15001.
func Defaults() Config {
	return Config{ProxyUID: 1337, OutboundPort: 15001, PinDir: DefaultPinDir}
}

func (c *Config) pinDir() string {
	if c.PinDir == "" {
		return DefaultPinDir
	}
	return c.PinDir
}

// Counters are totals since attach.
type Counters struct {
	Sockets            uint64 `json:"sockets"`
	Pairs              uint64 `json:"pairs"`
	RedirectedMessages uint64 `json:"redirected_messages"`
	RedirectedBytes    uint64 `json:"redirected_bytes"`
	Fallbacks          uint64 `json:"fallbacks"`
	Ambiguous          uint64 `json:"ambiguous"`
	KeptForProxy       uint64 `json:"kept_for_proxy"`
	// PeerPairs: of Pairs, connections between the sidecars of two pods
	// of this node.
	PeerPairs uint64 `json:"peer_pairs"`
}

// Sub returns c - o, counter by counter (what happened between two reads).
func (c Counters) Sub(o Counters) Counters {
	return Counters{
		Sockets: c.Sockets - o.Sockets, Pairs: c.Pairs - o.Pairs,
		RedirectedMessages: c.RedirectedMessages - o.RedirectedMessages, RedirectedBytes: c.RedirectedBytes - o.RedirectedBytes,
		Fallbacks: c.Fallbacks - o.Fallbacks, Ambiguous: c.Ambiguous - o.Ambiguous, KeptForProxy: c.KeptForProxy - o.KeptForProxy,
		PeerPairs: c.PeerPairs - o.PeerPairs,
	}
}

// Add returns c + o, counter by counter.
func (c Counters) Add(o Counters) Counters {
	return Counters{
		Sockets: c.Sockets + o.Sockets, Pairs: c.Pairs + o.Pairs,
		RedirectedMessages: c.RedirectedMessages + o.RedirectedMessages, RedirectedBytes: c.RedirectedBytes + o.RedirectedBytes,
		Fallbacks: c.Fallbacks + o.Fallbacks, Ambiguous: c.Ambiguous + o.Ambiguous, KeptForProxy: c.KeptForProxy + o.KeptForProxy,
		PeerPairs: c.PeerPairs + o.PeerPairs,
	}
}

// counter indexes mw_counters, in the order of fastpath.c's enum counter.
const (
	cSockets = iota
	cPairs
	cMessages
	cBytes
	cFallbacks
	cAmbiguous
	cKeptForProxy
	cPeerPairs
	cMax
)

// Status is what status reports.
type Status struct {
	Attached bool   `json:"attached"`
	PinDir   string `json:"pin_dir"`
	// CgroupID is the cgroup v2 the sockops program is attached to (the
	// inode number of its directory).
	CgroupID     uint64  `json:"cgroup_id,omitempty"`
	ProxyUID     uint32  `json:"proxy_uid,omitempty"`
	ProxyGID     *uint32 `json:"proxy_gid,omitempty"`
	OutboundPort uint16  `json:"outbound_port,omitempty"`
	IntoProxy    bool    `json:"into_proxy"`
	// KernelSplices: the kernel's splice() reads redirected bytes
	// (SplicesRedirected), so every proxy is fed, whatever IntoProxy says.
	KernelSplices bool `json:"kernel_splices"`
	LiveSockets   int  `json:"live_sockets"`
	// PodPolicies counts the meshed pods with a policy (mw_pods).
	PodPolicies int `json:"pod_policies"`
	Counters
}

// ErrUnsupported wraps every failure that comes from what the kernel or the
// node lacks (as opposed to a bad flag or a failing command).
var ErrUnsupported = errors.New("the fast path cannot run here")

func unsupported(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrUnsupported, fmt.Sprintf(format, a...))
}

// Result is what Attach did.
type Result int

const (
	// Attached: nothing was attached; now it is.
	Attached Result = iota
	// AlreadyAttached: this build's programs were attached with the same
	// settings; nothing changed.
	AlreadyAttached
	// Replaced: another build's programs (same layout, same settings)
	// were attached; they were detached and this build's attached.
	Replaced
)

// Attach attaches the fast path. When it is attached at cfg.PinDir with
// the same settings it compares the attached programs' tags with this
// build's: the same, it changes nothing (AlreadyAttached); different (an
// upgrade or a downgrade), it detaches them and attaches this build's
// (Replaced). With other settings it fails (detach first).
//
// The replacement is a detach and an attach, not an in-place
// link.Update: a new program with the old maps would meet sockets whose
// per-socket state the old program wrote, and each build's maps are its
// own. Sockets on the old programs keep them until they close (the
// kernel keeps the old sockhash through them, see Detach), with their
// new messages on TCP; new sockets get the new programs. A socket opened
// in the few milliseconds between the two is not tracked and stays on TCP.
func Attach(cfg Config) (Result, error) { return attach(cfg, loadBpf) }

// attach is Attach with the programs' spec from loadSpec (tests load
// another build's).
func attach(cfg Config, loadSpec func() (*ebpf.CollectionSpec, error)) (Result, error) {
	dir := cfg.pinDir()
	// Supported mounts bpffs when absent: before the lock, which is on it.
	if err := Supported(); err != nil {
		return 0, err
	}
	l, err := lock()
	if err != nil {
		return 0, err
	}
	defer l.Release()
	// Loaded once: compared with an attached build's, then attached.
	objs, err := load(cfg, loadSpec)
	if err != nil {
		return 0, err
	}
	defer objs.Close()
	result := Attached
	var kept map[uint64]podpolicy.Value // the replaced build's pod policies
	var keptRules []keptEntry           // and their mirrored interception settings
	if IsAttached(dir) {
		st := Status{}
		if err := readSettings(dir, &st); err != nil {
			return 0, err
		}
		if st.ProxyUID != cfg.ProxyUID || !sameGID(st.ProxyGID, cfg.ProxyGID) || st.OutboundPort != cfg.OutboundPort || st.IntoProxy != cfg.IntoProxy {
			return 0, fmt.Errorf("already attached with proxy uid %d, proxy gid %s, outbound port %d, into proxy %v: detach first to change them",
				st.ProxyUID, describeGID(st.ProxyGID), st.OutboundPort, st.IntoProxy)
		}
		same, err := sameTags(dir, objs)
		if err != nil {
			return 0, err
		}
		if same {
			return AlreadyAttached, nil
		}
		result = Replaced
	}
	// Before anything is detached: a refused attach changes nothing.
	if other, ok := otherLayout(dir); ok {
		return 0, fmt.Errorf("the fast path of another layout is attached (%s, by another meshwire version): its sockops program would keep taking the sockets; detach it first with that version's `meshwire fastpath detach`, or `meshwire fastpath detach --pin-dir %s`", other, other)
	}
	cg, err := cgroupDir(cfg.Cgroup)
	if err != nil {
		return 0, err
	}
	if result == Replaced {
		// The meshed pods' policies were written at their ADD, which
		// does not come again: they move to the new maps.
		if kept, err = readPodPolicies(dir); err != nil {
			return 0, err
		}
		if keptRules, err = readRules(dir); err != nil {
			return 0, err
		}
		if _, err := detach(dir); err != nil {
			return 0, fmt.Errorf("replace the attached programs of another build: %w", err)
		}
	}
	// Pins of a half-finished attach (killed between pins) go first.
	if err := removePins(dir); err != nil {
		return 0, err
	}
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{
		Target: objs.MwSocks.FD(), Program: objs.MwMsg, Attach: ebpf.AttachSkMsgVerdict,
	}); err != nil {
		return 0, unsupported("attach sk_msg to the sockhash: %v", err)
	}
	if _, err := seedSidecars(objs.MwSidecars, cfg.OutboundPort, cfg.ProxyUID, cfg.ProxyGID); err != nil {
		return 0, err
	}
	ctl := bpfControl{ProxyUid: cfg.ProxyUID, OutboundPort: cfg.OutboundPort}
	if cfg.ProxyGID != nil {
		ctl.MatchGid, ctl.ProxyGid = 1, *cfg.ProxyGID
	}
	if cfg.IntoProxy {
		ctl.IntoProxy = 1
	}
	if err := objs.MwControl.Put(uint32(0), ctl); err != nil {
		return 0, fmt.Errorf("write the fast path's control map: %w", err)
	}
	for cookie, v := range kept {
		if err := objs.MwPods.Put(cookie, v); err != nil {
			return 0, fmt.Errorf("carry over the pod policies: %w", err)
		}
	}
	if err := writeRules(objs, keptRules); err != nil {
		return 0, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, fmt.Errorf("create the pin directory: %w", err)
	}
	done := false
	defer func() {
		if !done {
			_ = removePins(dir)
		}
	}()
	if err := os.MkdirAll(podpolicy.RulesDir(dir), 0o700); err != nil {
		return 0, fmt.Errorf("create the pin directory: %w", err)
	}
	for name, m := range map[string]*ebpf.Map{pinSocks: objs.MwSocks, pinCounters: objs.MwCounters, pinControl: objs.MwControl, pinPods: objs.MwPods,
		rulesPin(dir, pods.PinPods): objs.MwRulesPods, rulesPin(dir, pods.PinPorts): objs.MwRulesPorts, rulesPin(dir, pods.PinCIDRs): objs.MwRulesCidrs} {
		if err := m.Pin(filepath.Join(dir, name)); err != nil {
			return 0, fmt.Errorf("pin %s: %w", name, err)
		}
	}
	sl, err := link.AttachCgroup(link.CgroupOptions{Path: cg, Attach: ebpf.AttachCGroupSockOps, Program: objs.MwSockops})
	if err != nil {
		return 0, unsupported("attach sockops to the cgroup %s: %v", cg, err)
	}
	defer sl.Close()
	// The link's pin is what "attached" means: it goes last.
	if err := sl.Pin(filepath.Join(dir, pinLink)); err != nil {
		return 0, fmt.Errorf("pin the sockops link: %w", err)
	}
	done = true
	return result, nil
}

// readPodPolicies reads the pod policies pinned at dir (none in a layout
// without them, v1).
func readPodPolicies(dir string) (map[uint64]podpolicy.Value, error) {
	pods, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinPods), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open the pinned pod policies: %w", err)
	}
	defer pods.Close()
	out := map[uint64]podpolicy.Value{}
	var k uint64
	var v podpolicy.Value
	it := pods.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read the pod policies: %w", err)
	}
	return out, nil
}

// rulesPin is the pin, relative to dir, of one of the maps that mirror the
// meshed pods' interception settings (package pods writes them under
// podpolicy.RulesDir, as it writes ebpf interception's).
func rulesPin(dir, name string) string {
	rel, _ := filepath.Rel(dir, filepath.Join(podpolicy.RulesDir(dir), name))
	return rel
}

// keptEntry is one entry of a mirrored-settings map, as bytes: pin names
// the map.
type keptEntry struct {
	pin        string
	key, value []byte
}

// readRules reads the mirrored interception settings pinned under dir (an
// attached build's, to carry over); none when it pinned none (an earlier
// build).
func readRules(dir string) ([]keptEntry, error) {
	var out []keptEntry
	for _, name := range []string{pods.PinPods, pods.PinPorts, pods.PinCIDRs} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(podpolicy.RulesDir(dir), name), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open the pinned interception settings: %w", err)
		}
		var k, v []byte
		it := m.Iterate()
		for it.Next(&k, &v) {
			out = append(out, keptEntry{name, slices.Clone(k), slices.Clone(v)})
		}
		err = it.Err()
		m.Close()
		if err != nil {
			return nil, fmt.Errorf("read the interception settings: %w", err)
		}
	}
	return out, nil
}

// writeRules writes entries read by readRules into objs' maps: ports and
// ranges before the pods' entries, as pods.Register does.
func writeRules(objs *bpfObjects, entries []keptEntry) error {
	to := map[string]*ebpf.Map{pods.PinPods: objs.MwRulesPods, pods.PinPorts: objs.MwRulesPorts, pods.PinCIDRs: objs.MwRulesCidrs}
	for _, pass := range []func(string) bool{
		func(pin string) bool { return pin != pods.PinPods },
		func(pin string) bool { return pin == pods.PinPods },
	} {
		for _, e := range entries {
			if !pass(e.pin) {
				continue
			}
			if err := to[e.pin].Put(e.key, e.value); err != nil {
				return fmt.Errorf("carry over the interception settings: %w", err)
			}
		}
	}
	return nil
}

// sameTags reports whether the programs attached at dir (sockops through
// its pinned link, sk_msg on the pinned sockhash) are objs' programs: the
// kernel's tags, hashes of the instructions with map references zeroed,
// are equal.
func sameTags(dir string, objs *bpfObjects) (bool, error) {
	attached, err := attachedTags(dir)
	if err != nil {
		return false, err
	}
	for _, p := range []struct {
		prog *ebpf.Program
		tag  string
	}{{objs.MwSockops, attached.sockops}, {objs.MwMsg, attached.msg}} {
		info, err := p.prog.Info()
		if err != nil {
			return false, fmt.Errorf("read this build's program: %w", err)
		}
		if info.Tag != p.tag {
			return false, nil
		}
	}
	return true, nil
}

// pinnedLink reads what the pinned sockops link at dir says: its program
// and the cgroup it attaches to.
func pinnedLink(dir string) (*link.Info, error) {
	l, err := link.LoadPinnedLink(filepath.Join(dir, pinLink), nil)
	if err != nil {
		return nil, fmt.Errorf("open the pinned sockops link: %w", err)
	}
	defer l.Close()
	li, err := l.Info()
	if err != nil {
		return nil, fmt.Errorf("read the sockops link: %w", err)
	}
	return li, nil
}

// Sockhashes counts the fast path's sockhashes alive in the kernel: the
// attached one, and those of earlier attachments (before a detach or a
// replacement) that sockets still on them keep.
func Sockhashes() (int, error) {
	n := 0
	for id := ebpf.MapID(0); ; {
		next, err := ebpf.MapGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("list the kernel's BPF maps: %w", err)
		}
		id = next
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue // gone meanwhile
		}
		info, err := m.Info()
		m.Close()
		if err == nil && info.Name == sockhashName {
			n++
		}
	}
}

// sockhashName is the fast path's sockhash as the kernel names it.
const sockhashName = "mw_socks"

// Program is a BPF program attached beside the fast path.
type Program struct {
	ID   uint32 `json:"id"`
	Name string `json:"name"`
	Tag  string `json:"tag"`
}

// sockopsName is the fast path's sockops program as the kernel names it.
const sockopsName = "mw_sockops"

// OtherSockops lists the sockops programs attached directly at the cgroup
// v2 directory cgroup (resolved as attach does; "" is the cgroup2 mount)
// that are not meshwire's, and returns the directory. Every sockops
// program at the root sees every socket of the node: one that puts them in
// a sockhash of its own and redirects their messages competes with the
// fast path for them.
func OtherSockops(cgroup string) (string, []Program, error) {
	dir, err := cgroupDir(cgroup)
	if err != nil {
		return "", nil, err
	}
	f, err := os.Open(dir)
	if err != nil {
		return dir, nil, err
	}
	defer f.Close()
	q, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: ebpf.AttachCGroupSockOps})
	if err != nil {
		return dir, nil, fmt.Errorf("list the sockops programs of %s: %w", dir, err)
	}
	var others []Program
	for _, ap := range q.Programs {
		p, err := ebpf.NewProgramFromID(ap.ID)
		if err != nil {
			continue // detached meanwhile
		}
		info, err := p.Info()
		p.Close()
		if err != nil {
			return dir, nil, fmt.Errorf("read program %d: %w", ap.ID, err)
		}
		if info.Name != sockopsName && info.Name != captureSockopsName {
			others = append(others, Program{ID: uint32(ap.ID), Name: info.Name, Tag: info.Tag})
		}
	}
	return dir, others, nil
}

// tags are the attached programs' tags.
type tags struct{ sockops, msg string }

// attachedTags reads the tags of the programs attached at dir.
func attachedTags(dir string) (tags, error) {
	var t tags
	li, err := pinnedLink(dir)
	if err != nil {
		return t, err
	}
	if t.sockops, err = programTag(li.Program); err != nil {
		return t, err
	}
	socks, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinSocks), nil)
	if err != nil {
		return t, fmt.Errorf("open the pinned sockhash: %w", err)
	}
	defer socks.Close()
	q, err := link.QueryPrograms(link.QueryOptions{Target: socks.FD(), Attach: ebpf.AttachSkMsgVerdict})
	if err != nil {
		return t, fmt.Errorf("query the sockhash's sk_msg program: %w", err)
	}
	if len(q.Programs) != 1 {
		return t, fmt.Errorf("the pinned sockhash has %d sk_msg programs, want 1", len(q.Programs))
	}
	t.msg, err = programTag(q.Programs[0].ID)
	return t, err
}

func programTag(id ebpf.ProgramID) (string, error) {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return "", fmt.Errorf("open program %d: %w", id, err)
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil {
		return "", fmt.Errorf("read program %d: %w", id, err)
	}
	return info.Tag, nil
}

// otherLayout returns the pin directory of a fast path of another layout
// version attached on this node (its sockops link pinned under
// podpolicy.Root beside dir), when dir is a default-style one.
func otherLayout(dir string) (string, bool) {
	return OtherLayout(podpolicy.Root, dir, func(other string) bool {
		_, err := os.Stat(filepath.Join(other, pinLink))
		return err == nil
	})
}

// OtherLayout returns a directory beside dir under root (the directory of
// every layout version's pins) for which attached is true, when dir is
// under root.
func OtherLayout(root, dir string, attached func(string) bool) (string, bool) {
	dir = filepath.Clean(dir)
	if filepath.Dir(dir) != root {
		return "", false
	}
	entries, _ := os.ReadDir(root)
	for _, e := range entries {
		other := filepath.Join(root, e.Name())
		if other != dir && attached(other) {
			return other, true
		}
	}
	return "", false
}

// load loads the programs and maps with cfg's constants, naming what the
// kernel lacks when it refuses them.
func load(cfg Config, loadSpec func() (*ebpf.CollectionSpec, error)) (*bpfObjects, error) {
	spec, err := loadSpec()
	if err != nil {
		return nil, fmt.Errorf("read the fast path's BPF object: %w", err)
	}
	// Where the kernel splices redirected bytes, every receiver may be
	// fed; the control map keeps what attach was asked (IntoProxy).
	splices, _ := SplicesRedirected()
	consts := map[string]any{"proxy_uid": cfg.ProxyUID, "outbound_port": cfg.OutboundPort, "into_proxy": boolByte(cfg.IntoProxy || splices)}
	if cfg.ProxyGID != nil {
		consts["proxy_gid"], consts["match_gid"] = *cfg.ProxyGID, uint8(1)
	}
	for name, v := range consts {
		if err := spec.Variables[name].Set(v); err != nil {
			return nil, fmt.Errorf("set %s: %w", name, err)
		}
	}
	var objs bpfObjects
	if err := spec.LoadAndAssign(&objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, unsupported("the kernel refused the fast path's programs (it needs sockops, sk_msg, sockhash, socket-local storage and bpf_skc_to_tcp_sock, Linux 5.15 or later): %v", FirstLines(fmt.Sprintf("%+v", ve), 3))
		}
		if errors.Is(err, unix.EPERM) {
			return nil, unsupported("loading BPF programs was refused (run as root: the fast path needs CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON): %v", err)
		}
		return nil, unsupported("load the fast path's programs: %v", err)
	}
	return &objs, nil
}

func sameGID(a, b *uint32) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// describeGID names a proxy gid setting for messages.
func describeGID(g *uint32) string {
	if g == nil {
		return "none"
	}
	return fmt.Sprint(*g)
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// FirstLines keeps the first n lines of s (a verifier log) on one line.
func FirstLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = append(lines[:n], "...")
	}
	return strings.Join(lines, " | ")
}

// Supported checks what the fast path needs of the node before anything is
// changed: kernel BTF (CO-RE), bpffs (mounted here when absent) and cgroup v2.
func Supported() error {
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		return unsupported("kernel BTF (/sys/kernel/btf/vmlinux) is missing: the programs read socket fields through CO-RE, which needs a kernel built with CONFIG_DEBUG_INFO_BTF")
	}
	if err := ensureBPFFS(); err != nil {
		return err
	}
	if _, err := Cgroup2Root(); err != nil {
		return err
	}
	return nil
}

func ensureBPFFS() error {
	var st unix.Statfs_t
	if err := unix.Statfs(bpffs, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if err := os.MkdirAll(bpffs, 0o755); err != nil {
		return unsupported("create %s: %v", bpffs, err)
	}
	if err := unix.Mount("bpf", bpffs, "bpf", 0, "mode=0700"); err != nil {
		return unsupported("mount bpffs on %s: %v", bpffs, err)
	}
	return nil
}

// CgroupDir is cgroupDir, for the other programs attached beside the fast
// path.
func CgroupDir(dir string) (string, error) { return cgroupDir(dir) }

// cgroupDir is the cgroup v2 directory to attach at: dir (or dir/unified,
// for a host's /sys/fs/cgroup mounted into a container on a hybrid
// layout), or the cgroup2 mount when dir is empty.
func cgroupDir(dir string) (string, error) {
	if dir == "" {
		return Cgroup2Root()
	}
	for _, d := range []string{dir, filepath.Join(dir, "unified")} {
		var st unix.Statfs_t
		if unix.Statfs(d, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return d, nil
		}
	}
	return "", unsupported("%s is not a cgroup v2 directory (nor is %s/unified)", dir, dir)
}

// Cgroup2Root is the cgroup v2 mount point, read from /proc/self/mountinfo
// (on hybrid layouts it is not /sys/fs/cgroup).
func Cgroup2Root() (string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", unsupported("read /proc/self/mountinfo: %v", err)
	}
	defer f.Close()
	if p, ok := cgroup2FromMountinfo(f); ok {
		return p, nil
	}
	return "", unsupported("no cgroup v2 mount in /proc/self/mountinfo: sockops programs attach to a cgroup v2")
}

// cgroup2FromMountinfo returns the mount point of the first cgroup2 mount.
// A mountinfo line is: id parent major:minor root mountpoint options
// [optional fields...] - fstype source superoptions.
func cgroup2FromMountinfo(r io.Reader) (string, bool) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok {
			continue
		}
		f, g := strings.Fields(pre), strings.Fields(post)
		if len(f) < 5 || len(g) < 1 || g[0] != "cgroup2" {
			continue
		}
		return unescapeMount(f[4]), true
	}
	return "", false
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) && isOctal(s[i+1]) && isOctal(s[i+2]) && isOctal(s[i+3]) {
			b.WriteByte((s[i+1]-'0')<<6 | (s[i+2]-'0')<<3 | (s[i+3] - '0'))
			i += 3
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isOctal(c byte) bool { return c >= '0' && c <= '7' }

// removePins removes the pin directory and what is pinned in it (an unpin
// is a file removal on bpffs), and the parent when it is left empty.
func removePins(dir string) error {
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove the pins in %s: %w", dir, err)
	}
	_ = os.Remove(filepath.Dir(dir)) // only when empty
	return nil
}

// IsAttached reports whether a fast path is attached at dir (its sockops
// link is pinned there), without opening anything.
func IsAttached(dir string) bool {
	if dir == "" {
		dir = DefaultPinDir
	}
	_, err := os.Stat(filepath.Join(dir, pinLink))
	return err == nil
}

// ReadStatus reports whether the fast path is attached at dir, with its
// counters.
func ReadStatus(dir string) (Status, error) {
	if dir == "" {
		dir = DefaultPinDir
	}
	st := Status{PinDir: dir}
	if !IsAttached(dir) {
		return st, nil
	}
	st.Attached = true
	if err := readSettings(dir, &st); err != nil {
		return st, err
	}
	st.KernelSplices, _ = SplicesRedirected()
	li, err := pinnedLink(dir)
	if err != nil {
		return st, err
	}
	if cg := li.Cgroup(); cg != nil {
		st.CgroupID = cg.CgroupId
	}
	if st.Counters, err = readCounters(filepath.Join(dir, pinCounters)); err != nil {
		return st, err
	}
	socks, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinSocks), nil)
	if err != nil {
		return st, fmt.Errorf("open the pinned sockhash: %w", err)
	}
	defer socks.Close()
	if st.LiveSockets, err = CountSockets(socks); err != nil {
		return st, err
	}
	pods, err := readPodPolicies(dir)
	st.PodPolicies = len(pods)
	return st, err
}

// readSettings reads what attach was given from the control map at dir.
func readSettings(dir string, st *Status) error {
	ctl, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinControl), nil)
	if err != nil {
		return fmt.Errorf("open the pinned control map: %w", err)
	}
	defer ctl.Close()
	var c bpfControl
	if err := ctl.Lookup(uint32(0), &c); err != nil {
		return fmt.Errorf("read the control map: %w", err)
	}
	st.ProxyUID, st.OutboundPort, st.IntoProxy = c.ProxyUid, c.OutboundPort, c.IntoProxy != 0
	if c.MatchGid != 0 {
		gid := c.ProxyGid
		st.ProxyGID = &gid
	}
	return nil
}

func readCounters(path string) (Counters, error) {
	sum, err := SumCounters(path, cMax)
	if err != nil {
		return Counters{}, err
	}
	return Counters{
		Sockets: sum[cSockets], Pairs: sum[cPairs], RedirectedMessages: sum[cMessages],
		RedirectedBytes: sum[cBytes], Fallbacks: sum[cFallbacks], Ambiguous: sum[cAmbiguous],
		KeptForProxy: sum[cKeptForProxy], PeerPairs: sum[cPeerPairs],
	}, nil
}

// SumCounters reads the first n counters of the pinned per-CPU array at
// path, each summed over the CPUs (the fast path's and the ebpf
// interception programs' counters).
func SumCounters(path string, n int) ([]uint64, error) {
	m, err := ebpf.LoadPinnedMap(path, nil)
	if err != nil {
		return nil, fmt.Errorf("open the pinned counters: %w", err)
	}
	defer m.Close()
	sum := make([]uint64, n)
	for i := range sum {
		if uint32(i) >= m.MaxEntries() {
			break // an earlier build's programs, with fewer counters
		}
		var perCPU []uint64
		if err := m.Lookup(uint32(i), &perCPU); err != nil {
			return nil, fmt.Errorf("read counter %d: %w", i, err)
		}
		for _, v := range perCPU {
			sum[i] += v
		}
	}
	return sum, nil
}

// CountSockets counts the sockets in the sockhash.
func CountSockets(socks *ebpf.Map) (int, error) {
	var k bpfSockKey
	var v uint64
	n := 0
	it := socks.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		return n, fmt.Errorf("walk the sockhash: %w", err)
	}
	return n, nil
}

// Detached is what Detach did.
type Detached struct {
	WasAttached bool
	// Live counts the sockets still on the fast path: they keep it until
	// they close.
	Live int
}

// Detach stops the fast path at dir: new messages go on TCP, no new socket
// is taken, the sockops attachment and every pin are removed.
func Detach(dir string) (Detached, error) {
	if dir == "" {
		dir = DefaultPinDir
	}
	if _, err := os.Stat(lockDir); errors.Is(err, os.ErrNotExist) {
		return Detached{}, nil // no bpffs mount point: nothing was ever pinned
	}
	l, err := lock()
	if err != nil {
		return Detached{}, err
	}
	defer l.Release()
	return detach(dir)
}

// detach is Detach with the lock held.
func detach(dir string) (Detached, error) {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return Detached{}, nil
	}
	d := Detached{WasAttached: true}
	var socks *ebpf.Map
	defer func() {
		if socks != nil {
			socks.Close()
		}
	}()
	if ctl, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinControl), nil); err == nil {
		var c bpfControl
		if ctl.Lookup(uint32(0), &c) == nil {
			c.Draining = 1
			err = ctl.Put(uint32(0), c)
		}
		ctl.Close()
		if err != nil {
			return d, fmt.Errorf("set the fast path draining: %w", err)
		}
		socks, _ = ebpf.LoadPinnedMap(filepath.Join(dir, pinSocks), nil)
	}
	// Removing the link's pin releases the sockops attachment (nothing
	// else holds the link); removing the maps' pins leaves them to the
	// programs that use them, the sk_msg program held by each socket
	// still on the fast path.
	if err := removePins(dir); err != nil {
		return d, err
	}
	if socks == nil {
		return d, nil
	}
	live, err := CountSockets(socks)
	d.Live = live
	return d, err
}
