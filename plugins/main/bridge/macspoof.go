package main

import (
	"context"
	"fmt"
	"net"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/ipmasq"
)

// macspoofchk: frames entering the bridge from the pod's port must carry the
// pod's MAC. Each attachment gets its own nftables table in the bridge
// family, named from the network and container id hashes like the
// masquerade tables, so DEL is one idempotent transaction.

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

func macSpoofDelScript(tables []string) string {
	var b strings.Builder
	for _, t := range tables {
		fmt.Fprintf(&b, "add table bridge %[1]s\ndelete table bridge %[1]s\n", t)
	}
	return b.String()
}

func macSpoofSetup(ctx context.Context, c *config, args *skel.CmdArgs, hostIf string, mac net.HardwareAddr) error {
	t := macSpoofTable(c.Name, args.ContainerID, args.IfName)
	if err := firewall.NftApply(ctx, macSpoofScript(t, hostIf, mac)); err != nil {
		return cnierr.Internal("macspoofchk: %v", err)
	}
	return nil
}

func macSpoofTeardown(ctx context.Context, c *config, args *skel.CmdArgs) error {
	t := macSpoofTable(c.Name, args.ContainerID, args.IfName)
	if err := firewall.NftApply(ctx, macSpoofDelScript([]string{t})); err != nil {
		return cnierr.Internal("macspoofchk teardown: %v", err)
	}
	return nil
}

func macSpoofGC(ctx context.Context, network string, valid []ipmasq.Attachment) error {
	out, err := firewall.Nft(ctx, "list", "tables", "bridge")
	if err != nil {
		return cnierr.Internal("macspoofchk GC: %v", err)
	}
	keep := map[string]bool{}
	for _, v := range valid {
		keep[macSpoofTable(network, v.ContainerID, v.IfName)] = true
	}
	var stale []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "table" && strings.HasPrefix(f[2], macSpoofPrefix(network)) && !keep[f[2]] {
			stale = append(stale, f[2])
		}
	}
	if len(stale) == 0 {
		return nil
	}
	if err := firewall.NftApply(ctx, macSpoofDelScript(stale)); err != nil {
		return cnierr.Internal("macspoofchk GC: %v", err)
	}
	return nil
}
