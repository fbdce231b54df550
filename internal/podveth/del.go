package podveth

import (
	"context"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/addressing"
	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/detach"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/ipamexec"
	"github.com/meshwire/meshwire/internal/ipmasq"
	"github.com/meshwire/meshwire/internal/link"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/refrules"
)

// Del tears the attachment down: IPAM DEL, in parallel with the masquerade
// rules, extra (the plugin's own firewall state, may be nil) and then the
// veth pair. It works with the namespace gone or never given, and with no
// prevResult, and it is idempotent.
func (a *Attachment) Del(ctx context.Context, extra func() (tail *os.File, err error)) error {
	var wg sync.WaitGroup
	errs := make([]error, 2)
	run := func(i int, step string, fn func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = cnierr.Catch(func() error { return timed(step, fn) })
		}()
	}
	if a.IPAMType != "" {
		run(0, "ipam del", func() error { return ipamexec.Del(ctx, a.IPAMType, a.Args.StdinData) })
	}
	run(1, "firewall and veth del", func() error {
		// The firewall removals go first, so that their tails (see
		// firewall.Interface.Release) ride with the child that deletes the veth.
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
func (a *Attachment) removeMasq(ctx context.Context) (tail *os.File, err error) {
	if !a.IPMasq {
		return nil, nil
	}
	var addrs []net.IPNet
	if a.Prev != nil {
		addrs = IPNets(addressing.IPsFor(a.Prev.IPs, ContainerIndex(a.Prev, a.Args.IfName, "")))
	}
	var fw *firewall.Host
	err = timed("masquerade del", func() error {
		var ferr error
		if fw, ferr = firewall.NewHost(ctx, a.Backend); ferr != nil {
			return ferr
		}
		return ipmasq.Teardown(ctx, fw, a.ID(), addrs)
	})
	if fw == nil {
		fw = firewall.New(firewall.Backend{}) // the reference's forms need none
	}
	// What the reference's ipMasq set up before an in-place upgrade, on the
	// same netlink connection: one socket, handed on with the others.
	rerr := timed("reference masquerade del", func() error {
		return refrules.DelMasq(ctx, fw, attachment.Reference{Network: a.Network, ContainerID: a.Args.ContainerID, IfName: a.Args.IfName})
	})
	tail = fw.Release()
	if rerr != nil {
		return tail, cnierr.Wrap(rerr, "the reference's ipMasq teardown")
	}
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
	ns, err := netns.Open(a.Args.Netns)
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
