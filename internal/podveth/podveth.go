// Package podveth is what the veth-based interface plugins (bridge, veth)
// share: their common config keys, the pod's veth pair, and the steps of
// ADD, DEL, CHECK, STATUS and GC around it (addresses announced, an
// attachment torn down in parallel: IPAM, links, masquerade; the firewall
// and IPAM parts of CHECK, STATUS and GC).
package podveth

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/addressing"
	"github.com/meshwire/meshwire/internal/announce"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/cniplugin"
	"github.com/meshwire/meshwire/internal/detach"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/hostlocal"
	"github.com/meshwire/meshwire/internal/ipamexec"
	"github.com/meshwire/meshwire/internal/ipmasq"
	"github.com/meshwire/meshwire/internal/link"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/undo"
)

// NS is the pod's namespace, open for netlink requests from the host thread.
type NS struct {
	Handle vnetns.NsHandle
	NL     *netlink.Handle
}

// Close releases the namespace.
func (n *NS) Close() {
	n.NL.Close()
	n.Handle.Close()
}

// OpenNS opens CNI_NETNS. Failures are code 4 and satisfy netns.IsGone.
func OpenNS(path string) (*NS, error) {
	if path == "" {
		return nil, cnierr.InvalidEnv("CNI_NETNS", "not set")
	}
	gone := func(err error) error {
		return errors.Join(cnierr.InvalidEnv("CNI_NETNS", "%v", err), &netns.Gone{Err: err})
	}
	nsh, err := vnetns.GetFromPath(path)
	if err != nil {
		return nil, gone(err)
	}
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(nsh), &st); err != nil || (st.Type != unix.NSFS_MAGIC && st.Type != unix.PROC_SUPER_MAGIC) {
		nsh.Close()
		return nil, gone(fmt.Errorf("%s is not a network namespace", path))
	}
	h, err := netlink.NewHandleAt(nsh, unix.NETLINK_ROUTE)
	if err != nil {
		nsh.Close()
		return nil, gone(err)
	}
	return &NS{Handle: nsh, NL: h}, nil
}

// StillThere fails when the namespace file at path no longer names the
// namespace that was opened (it was deleted while ADD ran): ADD then undoes
// its work instead of reporting a pod nobody can reach.
func (n *NS) StillThere(path string) error {
	var opened, now unix.Stat_t
	if err := unix.Fstat(int(n.Handle), &opened); err != nil {
		return cnierr.InvalidEnv("CNI_NETNS", "%v", err)
	}
	if err := unix.Stat(path, &now); err != nil || now.Ino != opened.Ino || now.Dev != opened.Dev {
		return cnierr.InvalidEnv("CNI_NETNS", "%s was deleted while ADD ran", path)
	}
	return nil
}

// Jobs are the detached jobs of the veth-based plugins; their main calls
// detach.Run(podveth.Jobs) first.
var Jobs = map[string]detach.Job{
	announce.JobName:   announce.Job,
	link.DeleteJobName: link.DeleteJob,
}

// meshwire's host-local is compiled into the veth-based plugins: IPAM runs
// in-process when the host-local on CNI_PATH is the binary built with the
// plugin, saving a process start on every ADD, DEL and CHECK.
func init() {
	ipamexec.Link(ipamexec.Linked{
		Type: hostlocal.Type, BuildID: hostlocal.BuildID,
		Add: hostlocal.Add, Del: hostlocal.Del, Check: hostlocal.Check, GC: hostlocal.GC, Status: hostlocal.Status,
	})
}

// IPNets lists the addresses of ips.
func IPNets(ips []*current.IPConfig) []net.IPNet {
	out := make([]net.IPNet, 0, len(ips))
	for _, ip := range ips {
		out = append(out, ip.Address)
	}
	return out
}

// DNSSet reports whether the config's dns object says anything (it then
// replaces what IPAM returned, as with the reference plugins).
func DNSSet(d types.DNS) bool {
	return d.Nameservers != nil || d.Search != nil || d.Options != nil || d.Domain != ""
}

// ContainerIndex is the index of the container interface in r, -1 if none.
func ContainerIndex(r *current.Result, ifName, netnsPath string) int {
	for i, intf := range r.Interfaces {
		if intf.Name == ifName && intf.Sandbox != "" && (netnsPath == "" || intf.Sandbox == netnsPath) {
			return i
		}
	}
	return -1
}

// Announce sends gratuitous ARP / unsolicited NA for ips from inside the
// namespace, from a detached helper process (see announce.Start), which also
// carries tails (nil ones are skipped; they are closed here when no helper
// starts). A failure is logged: the pod works, neighbours learn a little
// later.
func (n *NS) Announce(ifName string, ips []*current.IPConfig, tails ...*os.File) {
	var addrs []net.IP
	for _, ip := range ips {
		addrs = append(addrs, ip.Address.IP)
	}
	var keep []*os.File
	for _, f := range tails {
		if f != nil {
			keep = append(keep, f)
		}
	}
	if err := announce.Start(int(n.Handle), ifName, addrs, keep...); err != nil {
		slog.Warn("announcing addresses failed", "error", err)
	}
	for _, f := range keep {
		_ = f.Close()
	}
}

// Attachment is one pod interface as the shared steps see it.
type Attachment struct {
	Args       *skel.CmdArgs
	Network    string
	IPAMType   string // "" when the plugin has no IPAM
	IPMasq     bool
	Backend    string // ipMasqBackend, "" to detect
	HostPrefix string
	MAC        net.HardwareAddr // the pod interface's MAC, nil for a random one
	Prev       *current.Result  // prevResult, may be nil
	prevErr    error
}

// NewAttachment is the shared view of one plugin call: base and common are
// the decoded config's shared parts, r what common.Validate derived.
func NewAttachment(args *skel.CmdArgs, base *cniplugin.Base, common *Common, r Resolved) *Attachment {
	prev, err := base.PrevResultCurrent()
	return &Attachment{
		Args: args, Network: base.Name, IPAMType: base.IPAM.Type, IPMasq: common.IPMasq,
		Backend: r.Backend, HostPrefix: r.Prefix, MAC: r.MAC, Prev: prev, prevErr: err,
	}
}

// Add is an ADD in progress: the pod's namespace, what to undo if ADD fails,
// and the IPAM call running in the background (nil without IPAM).
type Add struct {
	NS   *NS
	Undo undo.Stack
	IPAM *ipamexec.Pending
}

// BeginAdd checks CNI_IFNAME, opens the namespace and starts IPAM (which
// does not depend on the links, so it runs while they are built).
func (a *Attachment) BeginAdd(ctx context.Context) (*Add, error) {
	if err := link.ValidIfName(a.Args.IfName); err != nil {
		return nil, cnierr.InvalidEnv("CNI_IFNAME", "%v", err)
	}
	ns, err := OpenNS(a.Args.Netns)
	if err != nil {
		return nil, err
	}
	add := &Add{NS: ns}
	if a.IPAMType != "" {
		add.IPAM = ipamexec.Start(ctx, a.IPAMType, a.Args.StdinData)
		add.Undo.Push(add.IPAM.Release)
	}
	return add, nil
}

// End finishes the ADD: when it failed (err != nil) everything recorded is
// undone, IPAM included; the namespace is closed either way.
func (x *Add) End(err error) {
	if err != nil {
		x.Undo.Run()
	}
	x.NS.Close()
}

// Check is CHECK's frame: prevResult is required; IPAM CHECK and the
// masquerade check run in the background while own (the plugin's part)
// checks links, addresses and routes.
func (a *Attachment) Check(ctx context.Context, own func(prev *current.Result) error) error {
	if a.prevErr != nil {
		return a.prevErr
	}
	if a.Prev == nil {
		return cnierr.Field("prevResult", "missing: CHECK compares the kernel with the result of ADD")
	}
	ipamDone := a.StartCheckIPAM(ctx)
	masq := make(chan error, 1)
	go func() {
		addrs := IPNets(addressing.IPsFor(a.Prev.IPs, ContainerIndex(a.Prev, a.Args.IfName, a.Args.Netns)))
		masq <- a.CheckMasq(ctx, addrs)
	}()
	err := own(a.Prev)
	masqErr, ipamErr := <-masq, ipamDone()
	return joinErrors(err, masqErr, ipamErr)
}

// Masq is the masquerade identity of the attachment.
func (a *Attachment) Masq() ipmasq.Attachment {
	return ipmasq.Attachment{Network: a.Network, ContainerID: a.Args.ContainerID, IfName: a.Args.IfName}
}

// HostVeth is the host end's name.
func (a *Attachment) HostVeth() string {
	return link.HostVethName(a.HostPrefix, a.Args.ContainerID, a.Args.IfName)
}

// SetupMasq installs masquerading of addrs; the returned func undoes it, and
// the file, when not nil, is a tail for Announce to hand over (see
// ipmasq.Setup).
func (a *Attachment) SetupMasq(ctx context.Context, addrs []net.IPNet) (func(), *os.File, error) {
	b := ipmasq.Backend(ctx, a.Backend)
	m := a.Masq()
	tail, err := ipmasq.Setup(ctx, b, m, addrs)
	if err != nil {
		return nil, nil, cnierr.Wrap(err, "ipMasq")
	}
	return func() {
		if tail, _ := ipmasq.Teardown(ctx, b, m, addrs); tail != nil {
			_ = tail.Close()
		}
	}, tail, nil
}

// Del tears the attachment down: IPAM DEL, in parallel with the masquerade
// rules, extra (the plugin's own firewall state, may be nil) and then the
// veth pair. It works with the namespace gone or never given, and with no
// prevResult, and it is idempotent.
func (a *Attachment) Del(ctx context.Context, extra func() (tail *os.File, err error)) error {
	var wg sync.WaitGroup
	errs := make([]error, 2)
	names := []string{"ipam del", "firewall and veth del"}
	run := func(i int, fn func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			errs[i] = fn()
			slog.Debug("step", "step", names[i], "ms", float64(time.Since(start).Microseconds())/1000)
		}()
	}
	if a.IPAMType != "" {
		run(0, func() error { return ipamexec.Del(ctx, a.IPAMType, a.Args.StdinData) })
	}
	run(1, func() error {
		// The firewall removals go first, so that their tails (see
		// firewall.Conn.Release) ride with the child that deletes the veth.
		var tails []*os.File
		keep := func(tail *os.File, err error) error {
			if tail != nil {
				tails = append(tails, tail)
			}
			return err
		}
		err := keep(a.removeMasq(ctx))
		if extra != nil {
			err = joinErrors(err, keep(extra()))
		}
		return joinErrors(err, a.removeVeth(tails))
	})
	wg.Wait()
	return joinErrors(errs...)
}

// removeMasq removes the attachment's masquerade rules, when ipMasq is set;
// see ipmasq.Teardown for the file returned.
func (a *Attachment) removeMasq(ctx context.Context) (*os.File, error) {
	if !a.IPMasq {
		return nil, nil
	}
	start := time.Now()
	var addrs []net.IPNet
	if a.Prev != nil {
		addrs = IPNets(addressing.IPsFor(a.Prev.IPs, ContainerIndex(a.Prev, a.Args.IfName, "")))
	}
	tail, err := ipmasq.Teardown(ctx, ipmasq.Backend(ctx, a.Backend), a.Masq(), addrs)
	slog.Debug("step", "step", "masquerade del", "ms", float64(time.Since(start).Microseconds())/1000)
	return tail, cnierr.Wrap(err, "ipMasq teardown")
}

// removeVeth deletes the pod's veth pair: through the host end's name (no
// namespace needed; DEL returns once the pair is gone from view, while a
// detached child waits for the kernel to reclaim it and carries tails, see
// detach.StartHolding), else through CNI_IFNAME inside the namespace when it
// still exists. Nothing there is not an error.
func (a *Attachment) removeVeth(tails []*os.File) error {
	defer func() {
		for _, f := range tails {
			_ = f.Close()
		}
	}()
	host := a.HostVeth()
	handed := false
	deleted, err := link.DeleteAndWait(host, func() error {
		err := detach.StartHolding(link.DeleteJobName, host, nil, tails)
		handed = err == nil
		return err
	}, 5*time.Second)
	if !handed && len(tails) > 0 {
		_ = detach.Hold(tails...)
	}
	if err != nil {
		return cnierr.Internal("%v", err)
	}
	if deleted || a.Args.Netns == "" {
		return nil
	}
	ns, err := OpenNS(a.Args.Netns)
	if err != nil {
		slog.Info("namespace not usable, nothing to remove inside it", "error", err)
		return nil
	}
	defer ns.Close()
	l, err := ns.NL.LinkByName(a.Args.IfName)
	if err != nil {
		return nil
	}
	if _, ok := l.(*netlink.Veth); !ok {
		return nil
	}
	if err := ns.NL.LinkDel(l); err != nil && !link.IsNotFound(err) {
		return cnierr.Internal("delete %s: %v", a.Args.IfName, err)
	}
	return nil
}

// CheckMasq verifies the masquerade rules of addrs are installed.
func (a *Attachment) CheckMasq(ctx context.Context, addrs []net.IPNet) error {
	if !a.IPMasq || len(addrs) == 0 {
		return nil
	}
	b := ipmasq.Backend(ctx, a.Backend)
	m := a.Masq()
	ok, err := ipmasq.Present(ctx, b, m, addrs)
	if err != nil {
		return cnierr.CheckFailed("ipMasq: %v", err)
	}
	if !ok {
		name := m.Chain()
		if b.Kind == firewall.NFTables {
			name = m.Table()
		}
		return cnierr.CheckFailed("ipMasq rules of this attachment (%s, %s) are missing", name, b)
	}
	return nil
}

// StartCheckIPAM runs IPAM CHECK in the background (while the plugin checks
// its own part) and returns the function that waits for its outcome.
func (a *Attachment) StartCheckIPAM(ctx context.Context) func() error {
	if a.IPAMType == "" {
		return func() error { return nil }
	}
	done := make(chan error, 1)
	go func() { done <- ipamexec.Check(ctx, a.IPAMType, a.Args.StdinData) }()
	return func() error { return <-done }
}

// Status is STATUS: the firewall backend must be usable when ipMasq is on,
// and IPAM must be ready.
func (a *Attachment) Status(ctx context.Context) error {
	if a.IPMasq {
		if err := ipmasq.Backend(ctx, a.Backend).Available(ctx); err != nil {
			return err
		}
	}
	if a.IPAMType != "" {
		return ipamexec.Status(ctx, a.IPAMType, a.Args.StdinData)
	}
	return nil
}

// GC removes the masquerade rules of the network's attachments that are not
// in valid, runs extra (the plugin's own) and delegates GC to IPAM.
func (a *Attachment) GC(ctx context.Context, valid []types.GCAttachment, extra func([]ipmasq.Attachment) error) error {
	var keep []ipmasq.Attachment
	for _, v := range valid {
		keep = append(keep, ipmasq.Attachment{Network: a.Network, ContainerID: v.ContainerID, IfName: v.IfName})
	}
	var errs []error
	if a.IPMasq {
		errs = append(errs, cnierr.Wrap(ipmasq.GC(ctx, ipmasq.Backend(ctx, a.Backend), a.Network, keep), "ipMasq GC"))
	}
	if extra != nil {
		errs = append(errs, extra(keep))
	}
	if a.IPAMType != "" {
		errs = append(errs, ipamexec.GC(ctx, a.IPAMType, a.Args.StdinData))
	}
	return joinErrors(errs...)
}

// CreateVeth makes the attachment's veth pair, replacing a host end left by
// an earlier ADD of the same attachment (its name says it is ours). A
// CNI_IFNAME already present in the namespace is code 4.
func (a *Attachment) CreateVeth(ns *NS, mtu int) (host, cont netlink.Link, err error) {
	p := link.Pair{HostName: a.HostVeth(), PeerName: a.Args.IfName, MTU: mtu, PeerMAC: a.MAC, NS: ns.Handle}
	host, err = link.Create(p)
	if errors.Is(err, link.ErrExists) {
		if _, e := ns.NL.LinkByName(a.Args.IfName); e == nil {
			return nil, nil, cnierr.InvalidEnv("CNI_IFNAME", "%q already exists in the namespace", a.Args.IfName)
		}
		if _, e := link.DeleteByName(p.HostName); e != nil {
			return nil, nil, cnierr.Internal("remove stale %s: %v", p.HostName, e)
		}
		host, err = link.Create(p)
	}
	if err != nil {
		return nil, nil, cnierr.Internal("%v", err)
	}
	cont, err = ns.NL.LinkByName(a.Args.IfName)
	if err != nil {
		_, _ = link.DeleteByName(p.HostName)
		return nil, nil, cnierr.Internal("find %s in the namespace: %v", a.Args.IfName, err)
	}
	return host, cont, nil
}

// CheckVeth verifies the container interface of prevResult (contIntf): it is
// a veth with the recorded MAC, and its host end exists and is listed in
// prevResult. It returns both ends.
func CheckVeth(ns *NS, prev *current.Result, contIntf *current.Interface) (cont, host netlink.Link, err error) {
	name := contIntf.Name
	cont, err = ns.NL.LinkByName(name)
	if err != nil {
		return nil, nil, cnierr.CheckFailed("interface %q not found in %s", name, contIntf.Sandbox)
	}
	if _, ok := cont.(*netlink.Veth); !ok {
		return nil, nil, cnierr.CheckFailed("%q is a %s, not a veth", name, cont.Type())
	}
	if contIntf.Mac != "" && contIntf.Mac != cont.Attrs().HardwareAddr.String() {
		return nil, nil, cnierr.CheckFailed("%q has MAC %s, prevResult says %s", name, cont.Attrs().HardwareAddr, contIntf.Mac)
	}
	peer, err := link.HostPeerIndex(ns.NL, name)
	if err != nil {
		return nil, nil, cnierr.CheckFailed("%v", err)
	}
	host, err = netlink.LinkByIndex(peer)
	if err != nil {
		return nil, nil, cnierr.CheckFailed("host end of %q (ifindex %d) not found", name, peer)
	}
	for _, intf := range prev.Interfaces {
		if intf.Name == host.Attrs().Name && intf.Sandbox == "" {
			if intf.Mac != "" && intf.Mac != host.Attrs().HardwareAddr.String() {
				return nil, nil, cnierr.CheckFailed("host end %s has MAC %s, prevResult says %s", intf.Name, host.Attrs().HardwareAddr, intf.Mac)
			}
			return cont, host, nil
		}
	}
	return nil, nil, cnierr.CheckFailed("host end %s of %q is not in prevResult", host.Attrs().Name, name)
}

// Steps logs, at debug level, how long each step of a command took since
// the previous one: where the time of an ADD or DEL goes.
type Steps struct{ last time.Time }

// NewSteps starts the clock.
func NewSteps() *Steps { return &Steps{last: time.Now()} }

// Mark logs the step that just ended.
func (s *Steps) Mark(step string) {
	now := time.Now()
	slog.Debug("step", "step", step, "ms", float64(now.Sub(s.last).Microseconds())/1000)
	s.last = now
}

// joinErrors reports the failures of steps that ran side by side as one CNI
// error: the code of the first failure (so a "try again" or the IPAM
// plugin's own code reaches the runtime) and every message.
func joinErrors(errs ...error) error {
	var failed []error
	for _, e := range errs {
		if e != nil {
			failed = append(failed, e)
		}
	}
	switch len(failed) {
	case 0:
		return nil
	case 1:
		return failed[0]
	}
	msgs := make([]string, len(failed))
	for i, e := range failed {
		msgs[i] = e.Error()
	}
	return types.NewError(cnierr.Code(failed[0]), strings.Join(msgs, "; "), "")
}
