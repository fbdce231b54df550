// Package pods registers meshed pods with meshwire's netfilter-free
// interception (the "ebpf" mode, ../capture.c): a pod's capture
// settings go into the pinned maps under its network namespace cookie,
// and the pinned inbound program is attached to its interfaces. It opens
// pins only and never loads programs, so the intercept plugin carries none
// of the programs' object; the layouts match capture.c's (checked by the
// capture package's tests).
package pods

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/ebpf/loader"
	"github.com/meshwire/meshwire/ebpf/nsmap"
	"github.com/meshwire/meshwire/internal/netns"
)

// Limits of struct pod_capture (capture.c's MAX_OWNERS, MAX_GROUPS;
// interception's own limits for EBPF mode are checked against them where
// its settings are turned into these entries, internal/intercept/apply).
const (
	MaxOwners = 8
	MaxGroups = 64
)

// Flags of struct pod_capture (enum pod_flag).
const (
	FlagOutAll = 1 << iota
	FlagInAll
	FlagIn
	FlagLoopbackIncluded
	FlagGroupsOnly
	FlagDNS    // DNS capture (redirect-dns)
	FlagDNSAll // to every server, else the CIDRDNS ones
	// FlagEBPFMode, in the fast path's mirror (apply.MirrorOf): the pod is in
	// EBPF interception mode, whose connect() hook captures.
	FlagEBPFMode
	// FlagIPv4Only: the pod's IPv6 is left alone, as its rules would have
	// no IPv6 half (apply.WantIPv6 false). An entry without it captures
	// both families, as every entry did before it.
	FlagIPv4Only
)

// Capture is struct pod_capture, mw_cap_pods' value.
type Capture struct {
	Flags        uint32
	OutboundPort uint16
	InboundPort  uint16
	TunnelPort   uint16
	Owners       uint8
	Groups       uint8
	OwnerGID     uint32 // bit i: OwnerID[i] is a gid
	Lo4          [4]byte
	Lo4Mask      [4]byte
	OwnerID      [MaxOwners]uint32
	Group        [MaxGroups]uint32
	NetnsIno     uint64 // the namespace's nsfs inode, set by Register (see Stale)
}

// Port kinds (enum port_kind).
const (
	PortOutExclude = 1 + iota
	PortOutInclude
	PortInInclude
	PortInExclude
)

// PortKey is struct port_key, mw_cap_ports' key.
type PortKey struct {
	Netns uint64
	Port  uint16
	Kind  uint8
	Pad   [5]uint8
}

// CIDR kinds (enum cidr_kind).
const (
	CIDRExclude = 1 + iota
	CIDRInclude
	CIDRLocal
	CIDRDNS // the nameservers DNS capture is for
)

// CIDRKey is struct cidr_key, mw_cap_cidrs' key: an LPM prefix over kind,
// netns and the address (IPv4 as v4-mapped IPv6).
type CIDRKey struct {
	Prefixlen uint32
	Kind      uint32
	Netns     uint64
	Addr      [16]byte
}

// Settings are the map entries of one pod, without its namespace cookie.
type Settings struct {
	Capture Capture
	Ports   []PortKey
	CIDRs   []CIDRKey
}

// maps are the pinned maps a registration writes.
type maps struct {
	pods, ports, cidrs *ebpf.Map
}

func (m *maps) Close() {
	for _, x := range []*ebpf.Map{m.pods, m.ports, m.cidrs} {
		if x != nil {
			x.Close()
		}
	}
}

// ErrNotAttached: the capture programs are not attached on this node.
var ErrNotAttached = errors.New("the ebpf interception programs are not attached on this node (run `meshwire fastpath attach`, or the node agent)")

// ErrNoDNSHooks: the attached programs are of a build without DNS capture.
var ErrNoDNSHooks = errors.New("the ebpf interception programs attached on this node lack the sendmsg and recvmsg hooks (an older meshwire attached them; run this version's `meshwire fastpath attach` to upgrade them in place)")

func pinDir(dir string) string {
	if dir == "" {
		return loader.CapturePinDir
	}
	return dir
}

// open opens the pinned maps under dir; ErrNotAttached when they are not
// there.
func open(dir string) (*maps, error) {
	m := &maps{}
	for _, p := range []struct {
		name string
		to   **ebpf.Map
	}{{loader.PinPods, &m.pods}, {loader.PinPorts, &m.ports}, {loader.PinCIDRs, &m.cidrs}} {
		x, err := openMap(dir, p.name)
		if err != nil {
			m.Close()
			return nil, err
		}
		*p.to = x
	}
	return m, nil
}

// noBPFFSError: the pins' directory is not on a bpf file system in this
// mount namespace, so whether the programs are attached on the node cannot
// be seen from here. It is an ErrNotAttached, and an ErrBPFFSHidden, on
// which --ebpf-fallback does not fall back; its message says what to do.
type noBPFFSError struct{ dir, mount string }

func (e noBPFFSError) Error() string {
	return fmt.Sprintf("%s is not on a bpf file system in this mount namespace (%s is not bpffs), so the ebpf interception programs the node attached cannot be seen from here: "+
		"`ip netns exec` remounts /sys (use `nsenter --net=/var/run/netns/NAME` to keep the host's mounts), and a pod needs a hostPath volume for /sys/fs/bpf; "+
		"on a host with no bpffs, `mount -t bpf bpf /sys/fs/bpf`", e.dir, e.mount)
}

func (e noBPFFSError) Is(target error) bool {
	return target == ErrNotAttached || target == ErrBPFFSHidden
}

// ErrBPFFSHidden: the pins' directory is not on bpffs here, so whether the
// programs are attached cannot be told (a noBPFFSError is one).
var ErrBPFFSHidden = errors.New("the pins' directory is not on a bpf file system in this mount namespace")

// notBPFFS returns the closest existing ancestor of dir (dir included)
// when it is not on a bpf file system, "" when it is (or cannot be told).
func notBPFFS(dir string) string {
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		var st unix.Statfs_t
		err := unix.Statfs(d, &st)
		if err == nil {
			if st.Type == unix.BPF_FS_MAGIC {
				return ""
			}
			return d
		}
		if !errors.Is(err, unix.ENOENT) || d == "/" {
			return ""
		}
	}
}

// openMap opens one pinned map under dir; ErrNotAttached when it is not
// there.
func openMap(dir, name string) (*ebpf.Map, error) {
	dir = pinDir(dir)
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), nil)
	if errors.Is(err, os.ErrNotExist) {
		if fs := notBPFFS(dir); fs != "" {
			return nil, noBPFFSError{dir: dir, mount: fs}
		}
		return nil, ErrNotAttached
	}
	if err != nil {
		return nil, fmt.Errorf("open the pinned %s map (%s): %w", name, dir, err)
	}
	return m, nil
}

// Ready reports whether the programs pinned at dir can capture a pod with
// settings s: ErrNotAttached, or ErrNoDNSHooks for DNS capture over
// programs of a build without it.
func Ready(dir string, s Settings) error {
	m, err := open(dir)
	if err != nil {
		return err
	}
	m.Close()
	return dnsReady(dir, s)
}

func dnsReady(dir string, s Settings) error {
	if s.Capture.Flags&FlagDNS == 0 {
		return nil
	}
	if _, err := os.Stat(filepath.Join(pinDir(dir), loader.PinDNSHook)); err != nil {
		return fmt.Errorf("DNS capture: %w", ErrNoDNSHooks)
	}
	return nil
}

// Register writes the settings of the pod whose network namespace the
// calling thread is in (inside netns.Enter) under the programs pinned at
// dir. The ports and ranges go first, the pod's entry (which turns capture
// on) last, then the entries of an earlier registration that are not in s.
func Register(dir string, s Settings) error {
	ns, err := netns.Cookie()
	if err != nil {
		return err
	}
	ino, err := netns.Inode()
	if err != nil {
		return err
	}
	return RegisterNS(dir, ns, ino, s)
}

// RegisterNS is Register for the pod of network namespace cookie ns, whose
// nsfs inode is ino (the replay of the pods' records names namespaces so).
func RegisterNS(dir string, ns, ino uint64, s Settings) error {
	m, err := open(dir)
	if err != nil {
		return err
	}
	defer m.Close()
	if err := dnsReady(dir, s); err != nil {
		return err
	}
	s.Capture.NetnsIno = ino
	one := uint8(1)
	for _, k := range s.Ports {
		k.Netns = ns
		if err := m.ports.Put(k, one); err != nil {
			return fmt.Errorf("write the pod's capture ports: %w", err)
		}
	}
	for _, k := range s.CIDRs {
		k.Netns = ns
		if err := m.cidrs.Put(k, one); err != nil {
			return fmt.Errorf("write the pod's capture ranges: %w", err)
		}
	}
	if err := m.pods.Put(ns, s.Capture); err != nil {
		return fmt.Errorf("write the pod's capture settings: %w", err)
	}
	return m.prune(ns, s)
}

// prune removes the ports and ranges of namespace ns that keep does not
// name (all of them with keep nil).
func (m *maps) prune(ns uint64, keep Settings) error {
	var ports []PortKey
	var pk PortKey
	var v uint8
	it := m.ports.Iterate()
	for it.Next(&pk, &v) {
		if pk.Netns == ns && !slices.ContainsFunc(keep.Ports, func(k PortKey) bool { k.Netns = ns; return k == pk }) {
			ports = append(ports, pk)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("walk the capture ports: %w", err)
	}
	var cidrs []CIDRKey
	var ck CIDRKey
	it = m.cidrs.Iterate()
	for it.Next(&ck, &v) {
		if ck.Netns == ns && !slices.ContainsFunc(keep.CIDRs, func(k CIDRKey) bool { k.Netns = ns; return k == ck }) {
			cidrs = append(cidrs, ck)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("walk the capture ranges: %w", err)
	}
	for _, k := range ports {
		if err := m.ports.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("remove a capture port: %w", err)
		}
	}
	for _, k := range cidrs {
		if err := m.cidrs.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("remove a capture range: %w", err)
		}
	}
	return nil
}

// Forget removes the registration of the pod whose network namespace the
// calling thread is in: its entry first (capture stops), then its ports
// and ranges. A pod never registered, or no programs attached, is not an
// error.
func Forget(dir string) error {
	m, err := open(dir)
	if errors.Is(err, ErrNotAttached) {
		return nil
	}
	if err != nil {
		return err
	}
	defer m.Close()
	ns, err := netns.Cookie()
	if err != nil {
		return err
	}
	return m.forget(ns)
}

// forget removes namespace ns's registration: its entry first (capture
// stops), then its ports and ranges.
func (m *maps) forget(ns uint64) error {
	if err := m.pods.Delete(ns); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("remove the pod's capture settings: %w", err)
	}
	return m.prune(ns, Settings{})
}

// Stale returns the registrations (namespace cookie -> nsfs inode) whose
// namespace live, called after the registrations were read, does not list:
// pods whose namespace went without a DEL (nsmap.Stale).
func Stale(dir string, live func() (map[uint64]bool, error)) (map[uint64]uint64, error) {
	m, err := openMap(dir, loader.PinPods)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	return nsmap.Stale(m, captureInode, live)
}

func captureInode(c *Capture) uint64 { return c.NetnsIno }

// ForgetStale removes the registration of namespace cookie ns, which Stale
// reported with nsfs inode ino, if it is still there with that inode.
func ForgetStale(dir string, ns, ino uint64) error {
	m, err := open(dir)
	if err != nil {
		return err
	}
	defer m.Close()
	return nsmap.ForgetStale(m.pods, captureInode, ns, ino, func() error { return m.forget(ns) })
}

// Registered reads the settings registered for the pod whose network
// namespace the calling thread is in; ok is false when there are none.
//
// It opens the pods map only: every interception install of another mode
// asks it (to forget a registration from an earlier EBPF install).
func Registered(dir string) (c Capture, ok bool, err error) {
	m, err := openMap(dir, loader.PinPods)
	if errors.Is(err, ErrNotAttached) {
		return c, false, nil
	}
	if err != nil {
		return c, false, err
	}
	defer m.Close()
	ns, err := netns.Cookie()
	if err != nil {
		return c, false, err
	}
	switch err := m.Lookup(ns, &c); {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return c, false, nil
	case err != nil:
		return c, false, fmt.Errorf("read the pod's capture settings: %w", err)
	}
	return c, true, nil
}
