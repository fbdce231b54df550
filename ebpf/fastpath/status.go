package fastpath

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"

	"github.com/meshwire/meshwire/ebpf/loader"
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
	dir, err := loader.CgroupDir(cgroup)
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
