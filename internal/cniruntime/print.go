package cniruntime

// How the meshwire command prints pods and errors on a terminal.

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

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
	for _, p := range Pods(recs) {
		var nets, addrs []string
		for _, n := range p.Networks {
			nets = append(nets, n.Network+"@"+n.IfName)
		}
		for _, a := range p.Addresses {
			addrs = append(addrs, a.IfName+"="+a.Address)
		}
		if p.Error != "" {
			addrs = []string{"(" + p.Error + ")"}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", p.Name, p.ContainerID[:12], strings.Join(nets, ","), strings.Join(addrs, " "))
	}
	tw.Flush()
}

// WriteJSON writes the pods as one JSON array of Pod objects.
func WriteJSON(w io.Writer, recs []*Record) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(Pods(recs))
}

// Pod is a wired namespace as `meshwire ls` shows it.
type Pod struct {
	Name         string       `json:"name"`
	ContainerID  string       `json:"containerID"`
	NetNS        string       `json:"netns"`
	CreatedNetNS bool         `json:"createdNetns"`
	Created      time.Time    `json:"created"`
	Networks     []PodNetwork `json:"networks"`
	Addresses    []PodAddress `json:"addresses"`
	Error        string       `json:"error,omitempty"` // why Addresses could not be read ("namespace missing")
}

// PodNetwork is one attachment: the network's name and the interface.
type PodNetwork struct {
	Network string `json:"network"`
	IfName  string `json:"ifName"`
}

// PodAddress is one address inside the namespace, with its prefix length.
type PodAddress struct {
	IfName  string `json:"ifName"`
	Address string `json:"address"`
}

// Pods describes the records, with the addresses now inside each
// namespace.
func Pods(recs []*Record) []Pod {
	pods := make([]Pod, 0, len(recs))
	for _, rec := range recs {
		p := Pod{Name: rec.Name, ContainerID: rec.ContainerID, NetNS: rec.NetNS, CreatedNetNS: rec.CreatedNetNS, Created: rec.Created,
			Networks: []PodNetwork{}}
		for _, a := range rec.Attachments {
			p.Networks = append(p.Networks, PodNetwork{Network: a.Network, IfName: a.IfName})
		}
		p.Addresses, p.Error = addresses(rec.NetNS)
		pods = append(pods, p)
	}
	return pods
}

// addresses lists every address inside the namespace but link-local ones,
// sorted, or says why it cannot.
func addresses(path string) ([]PodAddress, string) {
	out := []PodAddress{}
	ns, err := netns.Open(path)
	if err != nil {
		return out, "namespace missing"
	}
	defer ns.Close()
	links, err := ns.NL.LinkList()
	if err != nil {
		return out, err.Error()
	}
	for _, l := range links {
		addrs, _ := ns.NL.AddrList(l, netlink.FAMILY_ALL)
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() {
				continue
			}
			out = append(out, PodAddress{IfName: l.Attrs().Name, Address: a.IPNet.String()})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].IfName+"="+out[i].Address < out[j].IfName+"="+out[j].Address
	})
	return out, ""
}

// OneLine joins a multi-line (errors.Join) error into one line.
func OneLine(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "\n", "; ")), " ")
}
