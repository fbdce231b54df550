package main

import (
	"context"
	"net"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"

	attid "github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// macspoofchk: frames entering the bridge from the pod's port must carry the
// pod's MAC. Each attachment gets its own nftables table in the bridge
// family (attid.ID.MacSpoofTable), written over netlink like ipMasq's
// table (no nft process, none needed on the node), so DEL is one
// idempotent transaction. The tables are native nftables whatever
// firewall backend ipMasq uses.

var macSpoofBackend = firewall.Backend{Kind: firewall.NFTables}

func macSpoofID(c *config, args *skel.CmdArgs) attid.ID {
	return attid.ID{Network: c.Name, ContainerID: args.ContainerID, IfName: args.IfName}
}

// macSpoofTable is the table of one attachment: frames from the pod's
// host-side port with another source MAC are dropped before the bridge
// sees them.
func macSpoofTable(table, hostIf string, mac net.HardwareAddr) ruleset.Table {
	return ruleset.Table{
		Family: ruleset.Bridge, Name: table,
		Chains: []ruleset.Chain{{
			Name: "prerouting",
			Base: &ruleset.BaseChain{Type: "filter", Hook: "prerouting", Priority: -300},
			Rules: []ruleset.Rule{{
				Match: []ruleset.Match{
					{Kind: ruleset.MatchIn, Name: hostIf},
					{Kind: ruleset.MatchEtherSrc, Not: true, Name: mac.String()},
				},
				Target: ruleset.Target{Kind: ruleset.Drop},
			}},
		}},
	}
}

func macSpoofSetup(ctx context.Context, c *config, args *skel.CmdArgs, hostIf string, mac net.HardwareAddr) error {
	fw := firewall.New(macSpoofBackend)
	defer fw.Close()
	return macSpoofInstall(ctx, fw, macSpoofID(c, args), hostIf, mac)
}

func macSpoofInstall(ctx context.Context, fw firewall.Interface, a attid.ID, hostIf string, mac net.HardwareAddr) error {
	tx := (&ruleset.Tx{}).ReplaceTable(macSpoofTable(a.MacSpoofTable(), hostIf, mac))
	if err := fw.Apply(ctx, tx); err != nil {
		return cnierr.Internal("macspoofchk: %v", err)
	}
	return nil
}

// macSpoofTeardown removes the attachment's table over netlink; the
// returned file is the socket whose close waits for the kernel (see
// firewall.Interface.Release).
func macSpoofTeardown(c *config, args *skel.CmdArgs) (*os.File, error) {
	fw := firewall.New(macSpoofBackend)
	err := macSpoofRemove(context.Background(), fw, macSpoofID(c, args))
	return fw.Release(), err
}

func macSpoofRemove(ctx context.Context, fw firewall.Interface, a attid.ID) error {
	tx := (&ruleset.Tx{}).DestroyTable(ruleset.TableID{Family: ruleset.Bridge, Name: a.MacSpoofTable()})
	if err := fw.Apply(ctx, tx); err != nil {
		return cnierr.Internal("macspoofchk teardown: %v", err)
	}
	return nil
}

func macSpoofGC(network string, valid []attid.ID) error {
	fw := firewall.New(macSpoofBackend)
	defer fw.Close()
	return macSpoofCollect(context.Background(), fw, network, valid)
}

// macSpoofCollect removes the tables of network's attachments not in valid.
func macSpoofCollect(ctx context.Context, fw firewall.Interface, network string, valid []attid.ID) error {
	tables, err := fw.Tables(ctx, ruleset.Bridge)
	if err != nil {
		return cnierr.Internal("macspoofchk GC: %v", err)
	}
	keep := map[string]bool{}
	for _, v := range valid {
		v.Network = network
		keep[v.MacSpoofTable()] = true
	}
	prefix := attid.MacSpoofTablePrefix(network)
	stale := &ruleset.Tx{}
	for _, t := range tables {
		if strings.HasPrefix(t, prefix) && !keep[t] {
			stale.DestroyTable(ruleset.TableID{Family: ruleset.Bridge, Name: t})
		}
	}
	if err := fw.Apply(ctx, stale); err != nil {
		return cnierr.Internal("macspoofchk GC: %v", err)
	}
	return nil
}
