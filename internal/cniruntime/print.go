package cniruntime

// How the meshwire command prints pods and errors on a terminal.

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/netns"
)

// WriteResults writes one line per attachment of rec: its network,
// interface and addresses, from the cached results.
func (rt *Runtime) WriteResults(w io.Writer, rec *Record) {
	for _, a := range rec.Attachments {
		res, err := rt.Result(rec, a)
		if err != nil || res == nil {
			continue
		}
		fmt.Fprintf(w, "  network %s on %s: %s\n", a.Network, a.IfName, describe(res))
	}
}

// describe summarizes a result: the pod-side interfaces with their addresses.
func describe(r *current.Result) string {
	var parts []string
	for _, ip := range r.IPs {
		where := ""
		if ip.Interface != nil && *ip.Interface >= 0 && *ip.Interface < len(r.Interfaces) {
			where = r.Interfaces[*ip.Interface].Name + " "
		}
		s := where + ip.Address.String()
		if ip.Gateway != nil {
			s += " via " + ip.Gateway.String()
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "no addresses"
	}
	return strings.Join(parts, ", ")
}

// WriteTable writes the pods as a table: name, container id, networks and
// the addresses inside each namespace.
func WriteTable(w io.Writer, recs []*Record) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tCONTAINER ID\tNETWORKS\tADDRESSES")
	for _, rec := range recs {
		var nets []string
		for _, a := range rec.Attachments {
			nets = append(nets, a.Network+"@"+a.IfName)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", rec.Name, rec.ContainerID[:12], strings.Join(nets, ","), strings.Join(addresses(rec.NetNS), " "))
	}
	tw.Flush()
}

// addresses lists "ifname=addr" for every address inside the namespace, or
// a note when the namespace is gone.
func addresses(path string) []string {
	ns, err := netns.Open(path)
	if err != nil {
		return []string{"(namespace missing)"}
	}
	defer ns.Close()
	links, err := ns.NL.LinkList()
	if err != nil {
		return []string{"(" + err.Error() + ")"}
	}
	var out []string
	for _, l := range links {
		addrs, _ := ns.NL.AddrList(l, netlink.FAMILY_ALL)
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() {
				continue
			}
			out = append(out, l.Attrs().Name+"="+a.IPNet.String())
		}
	}
	sort.Strings(out)
	return out
}

// OneLine joins a multi-line (errors.Join) error into one line.
func OneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}
