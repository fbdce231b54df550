package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"

	attid "github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/firewall"
)

// macspoofchk: frames entering the bridge from the pod's port must carry the
// pod's MAC. Each attachment gets its own nftables table in the bridge
// family (attid.ID.MacSpoofTable), so DEL is one idempotent
// transaction (over netlink). The tables are native nftables whatever
// firewall backend ipMasq uses.

var macSpoofBackend = firewall.Backend{Kind: firewall.NFTables}

func macSpoofID(c *config, args *skel.CmdArgs) attid.ID {
	return attid.ID{Network: c.Name, ContainerID: args.ContainerID, IfName: args.IfName}
}

// macSpoofScript renders the table for one attachment.
func macSpoofScript(table, hostIf string, mac net.HardwareAddr) string {
	return fmt.Sprintf(`add table bridge %[1]s
delete table bridge %[1]s
table bridge %[1]s {
	chain prerouting {
		type filter hook prerouting priority -300; policy accept;
		iifname "%[2]s" ether saddr != %[3]s drop
	}
}
`, table, hostIf, mac)
}

func macSpoofSetup(ctx context.Context, c *config, args *skel.CmdArgs, hostIf string, mac net.HardwareAddr) error {
	return macSpoofInstall(ctx, firewall.New(macSpoofBackend), macSpoofID(c, args), hostIf, mac)
}

func macSpoofInstall(ctx context.Context, fw firewall.Interface, a attid.ID, hostIf string, mac net.HardwareAddr) error {
	if err := fw.ApplyNft(ctx, macSpoofScript(a.MacSpoofTable(), hostIf, mac)); err != nil {
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
	if err := fw.DeleteTables(ctx, firewall.Bridge, []string{a.MacSpoofTable()}); err != nil {
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
	tables, err := fw.Tables(ctx, firewall.Bridge)
	if err != nil {
		return cnierr.Internal("macspoofchk GC: %v", err)
	}
	keep := map[string]bool{}
	for _, v := range valid {
		v.Network = network
		keep[v.MacSpoofTable()] = true
	}
	prefix := attid.MacSpoofTablePrefix(network)
	var stale []string
	for _, t := range tables {
		if strings.HasPrefix(t, prefix) && !keep[t] {
			stale = append(stale, t)
		}
	}
	if err := fw.DeleteTables(ctx, firewall.Bridge, stale); err != nil {
		return cnierr.Internal("macspoofchk GC: %v", err)
	}
	return nil
}
