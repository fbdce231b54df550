package fastpath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/ebpf/loader"
)

// Attach attaches the fast path. When it is attached at cfg.PinDir with
// the same settings it compares the attached programs' tags with this
// build's: the same, it changes nothing (loader.AlreadyAttached); different (an
// upgrade or a downgrade), it detaches them and attaches this build's
// (loader.Replaced). With other settings it fails (detach first).
//
// The replacement is a detach and an attach, not an in-place
// link.Update: a new program with the old maps would meet sockets whose
// per-socket state the old program wrote, and each build's maps are its
// own. Sockets on the old programs keep them until they close (the
// kernel keeps the old sockhash through them, see Detach), with their
// new messages on TCP; new sockets get the new programs. A socket opened
// in the few milliseconds between the two is not tracked and stays on TCP.
func Attach(cfg Config) (loader.Result, error) { return attach(cfg, loadBpf) }

// attach is Attach with the programs' spec from loadSpec (tests load
// another build's).
func attach(cfg Config, loadSpec func() (*ebpf.CollectionSpec, error)) (loader.Result, error) {
	dir := cfg.pinDir()
	l, err := loader.LockToAttach()
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
	result := loader.Attached
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
			return loader.AlreadyAttached, nil
		}
		result = loader.Replaced
	}
	// Before anything is detached: a refused attach changes nothing.
	if other, ok := otherLayout(dir); ok {
		return 0, fmt.Errorf("the fast path of another layout is attached (%s, by another meshwire version): its sockops program would keep taking the sockets; detach it first with that version's `meshwire fastpath detach`, or `meshwire fastpath detach --pin-dir %s`", other, other)
	}
	cg, err := loader.CgroupDir(cfg.Cgroup)
	if err != nil {
		return 0, err
	}
	if result == loader.Replaced {
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
	if err := loader.RemovePins(dir); err != nil {
		return 0, err
	}
	if err := link.RawAttachProgram(link.RawAttachProgramOptions{
		Target: objs.MwSocks.FD(), Program: objs.MwMsg, Attach: ebpf.AttachSkMsgVerdict,
	}); err != nil {
		return 0, loader.Unsupported("attach sk_msg to the sockhash: %v", err)
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
			_ = loader.RemovePins(dir)
		}
	}()
	if err := os.MkdirAll(loader.RulesDir(dir), 0o700); err != nil {
		return 0, fmt.Errorf("create the pin directory: %w", err)
	}
	for name, m := range map[string]*ebpf.Map{pinSocks: objs.MwSocks, pinCounters: objs.MwCounters, pinControl: objs.MwControl, pinPods: objs.MwPods,
		rulesPin(dir, loader.PinPods): objs.MwRulesPods, rulesPin(dir, loader.PinPorts): objs.MwRulesPorts, rulesPin(dir, loader.PinCIDRs): objs.MwRulesCidrs} {
		if err := m.Pin(filepath.Join(dir, name)); err != nil {
			return 0, fmt.Errorf("pin %s: %w", name, err)
		}
	}
	sl, err := link.AttachCgroup(link.CgroupOptions{Path: cg, Attach: ebpf.AttachCGroupSockOps, Program: objs.MwSockops})
	if err != nil {
		return 0, loader.Unsupported("attach sockops to the cgroup %s: %v", cg, err)
	}
	defer sl.Close()
	// The link's pin is what "attached" means: it goes last.
	if err := sl.Pin(filepath.Join(dir, pinLink)); err != nil {
		return 0, fmt.Errorf("pin the sockops link: %w", err)
	}
	done = true
	return result, nil
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
			return nil, loader.Unsupported("the kernel refused the fast path's programs (it needs sockops, sk_msg, sockhash, socket-local storage and bpf_skc_to_tcp_sock, Linux 5.15 or later): %v", loader.FirstLines(fmt.Sprintf("%+v", ve), 3))
		}
		if errors.Is(err, unix.EPERM) {
			return nil, loader.Unsupported("loading BPF programs was refused (run as root: the fast path needs CAP_BPF, CAP_NET_ADMIN and CAP_PERFMON): %v", err)
		}
		return nil, loader.Unsupported("load the fast path's programs: %v", err)
	}
	return &objs, nil
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

// otherLayout returns the pin directory of a fast path of another layout
// version attached on this node (its sockops link pinned under
// loader.FastpathRoot beside dir), when dir is a default-style one.
func otherLayout(dir string) (string, bool) {
	return loader.OtherLayout(loader.FastpathRoot, dir, func(other string) bool {
		_, err := os.Stat(filepath.Join(other, pinLink))
		return err == nil
	})
}
