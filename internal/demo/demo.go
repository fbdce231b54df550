// Package demo is `meshwire demo`: pods wired with a conflist, every
// feature the conflist has proved on them step by step, and everything
// removed afterwards, also when interrupted or when an earlier demo was
// killed. Two pods are plain, a third is meshed (meshwire's test proxy as
// its sidecar), a fourth is in Istio's ambient mode (the test proxy as
// ztunnel).
package demo

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/buildinfo"
	"github.com/meshwire/meshwire/internal/cniruntime"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/probe"
)

// StateDir keeps the demo's records on tmpfs, apart from the user's, so
// that a demo killed hard is cleaned up by the next one.
const StateDir = nodelayout.DemoDir

var demoPods = []string{"mwdemo-a", "mwdemo-b"}

// Options are what a demo runs with.
type Options struct {
	Conflist    []byte              // the conflist the two pods are wired with
	Runtime     *cniruntime.Runtime // its StateDir is the demo's own (StateDir)
	Out, ErrOut io.Writer
	Hold        time.Duration // keep the pods up this long before cleaning up
}

// Run wires two namespaces with the conflist, shows their addresses,
// proves what works, and removes everything, also when ctx ends (an
// interrupt).
func Run(ctx context.Context, o Options) error {
	list, err := libcni.ConfListFromBytes(o.Conflist)
	if err != nil {
		return fmt.Errorf("conflist: %w", err)
	}
	conflist, rt := o.Conflist, o.Runtime
	d := &demo{out: o.Out, errOut: o.ErrOut, rt: rt, ctx: ctx}
	if br := bridgeName(list); br != "" {
		if _, err := netlink.LinkByName(br); err != nil {
			d.newBridge = br // created by this demo: removed at the end
		}
	}
	stateEnv(rt)
	d.cleanup("leftovers of an earlier demo")
	defer func() {
		if ctx.Err() != nil {
			fmt.Fprintln(d.out, "\ninterrupted")
		}
		d.cleanup("")
	}()

	fmt.Fprintf(d.out, "meshwire demo — %s\nplugins from %s\n\n", buildinfo.String("command"), strings.Join(rt.CNIPath, ":"))
	var recs []*cniruntime.Record
	for i, name := range demoPods {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		caps := demoCaps(list, i)
		rec, _, err := rt.Add(ctx, name, conflist, "eth0", caps)
		if err != nil {
			return fmt.Errorf("add %s: %w", name, err)
		}
		recs = append(recs, rec)
		fmt.Fprintf(d.out, "wired %s (netns %s)%s\n", name, rec.NetNS, describeCaps(caps))
		rt.WriteResults(d.out, rec)
	}
	fmt.Fprintln(d.out)
	cniruntime.WriteTable(d.out, recs)
	fmt.Fprintln(d.out)

	for _, rec := range recs {
		d.step(fmt.Sprintf("%s: lo answers ping on 127.0.0.1", rec.Name), func() (string, error) {
			return ping(rec.NetNS, net.IPv4(127, 0, 0, 1))
		})
		d.step(fmt.Sprintf("%s: lo answers ping on ::1", rec.Name), func() (string, error) {
			return ping(rec.NetNS, net.IPv6loopback)
		})
	}
	a, b := recs[0], recs[1]
	if dst := podAddress(rt, b, true); dst != nil {
		d.step(fmt.Sprintf("%s reaches %s at %s", a.Name, b.Name, dst), func() (string, error) {
			return ping(a.NetNS, dst)
		})
		d.step(fmt.Sprintf("the host reaches %s at %s", b.Name, dst), func() (string, error) {
			return ping("", dst)
		})
	}
	if dst := podAddress(rt, b, false); dst != nil {
		d.step(fmt.Sprintf("%s reaches %s at %s", a.Name, b.Name, dst), func() (string, error) {
			return ping(a.NetNS, dst)
		})
	}
	if hasPlugin(list, "portmap") {
		d.portmapSteps(a, b)
	}
	if hasPlugin(list, "bandwidth") {
		d.bandwidthSteps(a, b)
	}
	if podAddress(rt, a, true) != nil {
		d.meshSteps(conflist, a, b)
		d.ambientSteps(conflist, a, b)
	}
	for _, rec := range recs {
		d.step(fmt.Sprintf("%s: CNI CHECK passes", rec.Name), func() (string, error) {
			return "", rt.Check(ctx, rec.Name)
		})
	}
	if o.Hold > 0 && ctx.Err() == nil {
		fmt.Fprintf(d.out, "\nholding the pods for %s (try `ip netns exec %s ip addr`); Ctrl-C cleans up now\n", o.Hold, recs[0].Name)
		select {
		case <-ctx.Done():
		case <-time.After(o.Hold):
		}
	}
	if d.failed > 0 {
		return fmt.Errorf("%d demo check(s) failed", d.failed)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted")
	}
	return nil
}

type demo struct {
	out       io.Writer
	errOut    io.Writer
	rt        *cniruntime.Runtime
	ctx       context.Context
	failed    int
	newBridge string
}

// step runs fn and shows its line, unless the demo is interrupted: then
// what is left is the cleanup.
func (d *demo) step(what string, fn func() (string, error)) {
	if d.ctx.Err() != nil {
		return
	}
	d.report(what, fn)
}

// report runs fn and shows its line, also when the demo is interrupted (a
// cleanup's report).
func (d *demo) report(what string, fn func() (string, error)) {
	detail, err := fn()
	if err != nil {
		d.failed++
		fmt.Fprintf(d.out, "  FAIL  %s: %s\n", what, cniruntime.OneLine(err))
		return
	}
	if detail != "" {
		detail = " (" + detail + ")"
	}
	fmt.Fprintf(d.out, "  ok    %s%s\n", what, detail)
}

// cleanup deletes every pod of the demo's state dir and any demo namespace
// left without a record. It runs with its own context: an interrupt must not
// stop the cleanup it triggered.
func (d *demo) cleanup(why string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	recs, _ := d.rt.List()
	if why == "" {
		fmt.Fprintln(d.out)
	}
	if len(recs) > 0 && why != "" {
		fmt.Fprintf(d.out, "removing %s\n", why)
	}
	removed := 0
	for _, rec := range recs {
		if _, err := d.rt.Del(ctx, rec.Name); err != nil {
			fmt.Fprintf(d.errOut, "meshwire: cleanup %s: %s\n", rec.Name, cniruntime.OneLine(err))
			continue
		}
		removed++
	}
	for _, name := range append(demoPods, demoMeshPod, demoAmbientPod) {
		if netns.Exists(name) {
			_ = netns.Delete(name)
		}
	}
	if why == "" && d.newBridge != "" {
		if ok, err := removeBridgeIfIdle(d.newBridge); err != nil {
			fmt.Fprintf(d.errOut, "meshwire: remove bridge %s: %v\n", d.newBridge, err)
		} else if ok {
			fmt.Fprintf(d.out, "removed bridge %s (created by the demo)\n", d.newBridge)
		}
	}
	if why == "" {
		left := []string{}
		for _, name := range append(demoPods, demoMeshPod, demoAmbientPod) {
			if netns.Exists(name) {
				left = append(left, name)
			}
		}
		if len(left) == 0 {
			fmt.Fprintf(d.out, "cleaned up: %d pod(s) deleted, no namespace left behind\n", removed)
		} else {
			fmt.Fprintf(d.errOut, "meshwire: cleanup left namespaces %v\n", left)
		}
		_ = os.RemoveAll(d.rt.StateDir)
	}
}

func ping(nsPath string, dst net.IP) (string, error) {
	rtt, err := probe.Ping(nsPath, dst, 2*time.Second)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("rtt %s", rtt.Round(time.Microsecond)), nil
}
