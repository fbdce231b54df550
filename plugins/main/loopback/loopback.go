package main

import (
	"errors"
	"log/slog"
	"net"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/cniplugin"
	"github.com/meshwire/meshwire/internal/netns"
)

const pluginType = "loopback"

// loName is the device the plugin works on. Like the reference, it ignores
// CNI_IFNAME: a runtime may pass the pod's interface name (eth0), and that
// interface is not loopback's to touch.
const loName = "lo"

// config has no keys of its own: everything is in the shared base.
type config struct {
	cniplugin.Base
}

func parseConfig(data []byte) (*config, error) {
	var c config
	if err := cniplugin.Decode(data, pluginType, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// loState is what the kernel shows of the loopback device.
type loState struct {
	up     bool
	v4, v6 *net.IPNet
}

func cmdAdd(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData)
	if err != nil {
		return err
	}
	prev, err := conf.PrevResultCurrent()
	if err != nil {
		return err
	}
	var st loState
	err = netns.Enter(args.Netns, func() error {
		link, err := loopbackLink()
		if err != nil {
			return err
		}
		if err := netlink.LinkSetUp(link); err != nil {
			return cnierr.Internal("set %s up: %v", loName, err)
		}
		st, err = readState(link)
		return err
	})
	if err != nil {
		return err
	}
	return types.PrintResult(buildResult(prev, args, st), conf.CNIVersion)
}

// buildResult returns prevResult untouched when chained (lo adds nothing a
// runtime needs to know), and describes lo otherwise, whatever CNI_IFNAME
// named.
func buildResult(prev *current.Result, args *skel.CmdArgs, st loState) types.Result {
	if prev != nil {
		return prev
	}
	r := &current.Result{
		CNIVersion: current.ImplementedSpecVersion, // PrintResult converts to conf.CNIVersion
		Interfaces: []*current.Interface{{Name: loName, Mac: "00:00:00:00:00:00", Sandbox: args.Netns}},
	}
	for _, a := range []*net.IPNet{st.v4, st.v6} {
		if a != nil {
			r.IPs = append(r.IPs, &current.IPConfig{Interface: current.Int(0), Address: *a})
		}
	}
	return r
}

func cmdCheck(args *skel.CmdArgs) error {
	if _, err := parseConfig(args.StdinData); err != nil {
		return err
	}
	return netns.Enter(args.Netns, func() error {
		link, err := loopbackLink()
		if err != nil {
			return err
		}
		st, err := readState(link)
		if err != nil {
			return err
		}
		return verify(loName, st)
	})
}

// verify is CHECK's decision: lo must be up and answer on 127.0.0.1.
func verify(ifName string, st loState) error {
	if !st.up {
		return cnierr.CheckFailed("%s is down", ifName)
	}
	if st.v4 == nil || !st.v4.IP.Equal(net.IPv4(127, 0, 0, 1)) {
		return cnierr.CheckFailed("%s has no address 127.0.0.1", ifName)
	}
	return nil
}

func cmdDel(args *skel.CmdArgs) error {
	if _, err := parseConfig(args.StdinData); err != nil {
		return err
	}
	if args.Netns == "" {
		return nil // the namespace is gone: so is its lo
	}
	err := netns.Enter(args.Netns, func() error {
		link, err := netlinksafe.LinkByName(loName)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if errors.As(err, &nf) {
				return nil
			}
			return cnierr.Internal("find %s: %v", loName, err)
		}
		if err := netlink.LinkSetDown(link); err != nil {
			return cnierr.Internal("set %s down: %v", loName, err)
		}
		return nil
	})
	if netns.IsGone(err) {
		// The namespace is gone or is not a namespace any more: there is no
		// lo left to take down, and DEL must succeed.
		slog.Info("namespace not usable, nothing to do", "error", err)
		return nil
	}
	return err
}

// cmdGC has nothing to collect: loopback keeps no state on the host.
func cmdGC(args *skel.CmdArgs) error {
	_, err := parseConfig(args.StdinData)
	return err
}

// cmdStatus: loopback needs nothing from the host, so it is always ready
// once its config decodes.
func cmdStatus(args *skel.CmdArgs) error {
	_, err := parseConfig(args.StdinData)
	return err
}

// loopbackLink finds lo in the current namespace; every network namespace
// has one.
func loopbackLink() (netlink.Link, error) {
	link, err := netlinksafe.LinkByName(loName)
	if err != nil {
		return nil, cnierr.Internal("find %s: %v", loName, err)
	}
	if link.Attrs().Flags&net.FlagLoopback == 0 {
		return nil, cnierr.Internal("%s is not a loopback device", loName)
	}
	return link, nil
}

func readState(link netlink.Link) (loState, error) {
	st := loState{up: link.Attrs().Flags&net.FlagUp != 0}
	addrs, err := netlinksafe.AddrList(link, netlink.FAMILY_ALL)
	if err != nil {
		return st, cnierr.Internal("list addresses of %s: %v", link.Attrs().Name, err)
	}
	for _, a := range addrs {
		if a.IP.To4() != nil {
			if st.v4 == nil {
				st.v4 = a.IPNet
			}
		} else if st.v6 == nil {
			st.v6 = a.IPNet
		}
	}
	return st, nil
}
