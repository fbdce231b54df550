package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/ipmasq"
)

// macspoofchk: frames entering the bridge from the pod's port must carry the
// pod's MAC. Each attachment gets its own nftables table in the bridge
// family, named from the network and container id hashes like the
// masquerade tables, so DEL is one idempotent transaction (over netlink).

func macSpoofPrefix(network string) string {
	return "meshwire_macspoof_" + ipmasq.NetHash(network) + "_"
}

func macSpoofTable(network, containerID, ifName string) string {
	return macSpoofPrefix(network) + ipmasq.AttHash(containerID, ifName)
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
	t := macSpoofTable(c.Name, args.ContainerID, args.IfName)
	if err := firewall.NftApply(ctx, macSpoofScript(t, hostIf, mac)); err != nil {
		return cnierr.Internal("macspoofchk: %v", err)
	}
	return nil
}

// macSpoofTeardown removes the attachment's table over netlink; the
// returned file is the socket whose close waits for the kernel (see
// firewall.Conn.Release).
func macSpoofTeardown(c *config, args *skel.CmdArgs) (*os.File, error) {
	conn, err := firewall.Open()
	if err != nil {
		return nil, cnierr.Internal("macspoofchk teardown: %v", err)
	}
	err = conn.DeleteTables(firewall.Bridge, []string{macSpoofTable(c.Name, args.ContainerID, args.IfName)})
	tail := conn.Release()
	if err != nil {
		return tail, cnierr.Internal("macspoofchk teardown: %v", err)
	}
	return tail, nil
}

func macSpoofGC(network string, valid []ipmasq.Attachment) error {
	conn, err := firewall.Open()
	if err != nil {
		return cnierr.Internal("macspoofchk GC: %v", err)
	}
	defer conn.Close()
	tables, err := conn.Tables(firewall.Bridge)
	if err != nil {
		return cnierr.Internal("macspoofchk GC: %v", err)
	}
	keep := map[string]bool{}
	for _, v := range valid {
		keep[macSpoofTable(network, v.ContainerID, v.IfName)] = true
	}
	var stale []string
	for _, t := range tables {
		if strings.HasPrefix(t, macSpoofPrefix(network)) && !keep[t] {
			stale = append(stale, t)
		}
	}
	if err := conn.DeleteTables(firewall.Bridge, stale); err != nil {
		return cnierr.Internal("macspoofchk GC: %v", err)
	}
	return nil
}
