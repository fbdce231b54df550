// Package hostlocal is meshwire's host-local IPAM: it allocates addresses
// from configured ranges and keeps them in a crash-safe store on the node
// (subpackages config and store). The host-local plugin binary runs it, and
// so do the bridge and veth plugins, in-process, when the host-local on
// CNI_PATH is the binary built with them (their main registers Linked with
// ipamexec).
package hostlocal

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/hostlocal/config"
	"github.com/meshwire/meshwire/internal/hostlocal/store"
	"github.com/meshwire/meshwire/internal/killpoint"
)

// Type is the plugin's type, its binary's name.
const Type = "host-local"

// BuildID is the Go build ID of the host-local binary built together with
// the binary this package is linked into; the Makefile sets it on the
// bridge and veth plugins, which run host-local in-process when the
// host-local found on CNI_PATH is that very binary (see ipamexec.Linked).
var BuildID string

func owner(args *skel.CmdArgs) store.Owner {
	return store.Owner{ID: strings.TrimSpace(args.ContainerID), IfName: args.IfName}
}

// Add allocates the container's addresses and returns the result, with the
// spec version of the config, in which the plugin prints it.
func Add(args *skel.CmdArgs) (*current.Result, string, error) {
	conf, err := config.Load(args.StdinData, args.Args)
	if err != nil {
		return nil, "", err
	}
	result := &current.Result{CNIVersion: current.ImplementedSpecVersion, Routes: conf.Routes}
	if conf.ResolvConf != "" {
		dns, err := parseResolvConf(conf.ResolvConf)
		if err != nil {
			return nil, "", cnierr.Field("ipam.resolvConf", "%v", err)
		}
		result.DNS = *dns
	}
	s, err := store.Open(conf.DataDir, conf.Network, conf.LockTimeout)
	if err != nil {
		return nil, "", err
	}
	defer s.Close()
	err = s.Update(func(tx *store.Tx) error {
		result.IPs, err = allocate(tx, conf, owner(args))
		return err
	})
	if err != nil {
		return nil, "", err
	}
	killpoint.Here("allocated")
	slog.Info("allocated", "ips", ipList(result.IPs))
	return result, conf.CNIVersion, nil
}

// unavailable is a failure to allocate that is neither a bad config nor
// transient: the address asked for is held, or a range set is full.
func unavailable(format string, a ...any) error {
	return types.NewError(cnierr.CodeInternal, fmt.Sprintf(format, a...), "")
}

// allocate takes one address from each range set for o: the requested one
// when a request falls in the set, otherwise the next free one round-robin.
// It runs in one transaction, so an error leaves nothing allocated.
func allocate(tx *store.Tx, conf *config.IPAM, o store.Owner) ([]*current.IPConfig, error) {
	held, err := tx.ByOwner(o)
	if err != nil {
		return nil, err
	}
	for _, a := range held {
		for _, rs := range conf.Ranges {
			if rs.Contains(a.IP) {
				return nil, unavailable("container %s interface %s already holds %s in network %s: a second ADD for the same container and interface is not allowed (DEL first)", o.ID, o.IfName, a.IP, conf.Network)
			}
		}
	}
	if err := checkRequested(conf); err != nil {
		return nil, err
	}
	requested := append([]net.IP(nil), conf.Requested...)
	var out []*current.IPConfig
	for idx, rs := range conf.Ranges {
		var want net.IP
		for i, r := range requested {
			if rs.Contains(r) {
				want = r
				requested = append(requested[:i], requested[i+1:]...)
				break
			}
		}
		var got net.IP
		var rng *config.Range
		if want != nil {
			rng = rs.RangeFor(want)
			if want.Equal(rng.Gateway) {
				return nil, cnierr.Config("requested address %s is the gateway of range %s", want, rng)
			}
			if cur, ok, err := tx.Get(want); err != nil {
				return nil, err
			} else if ok {
				return nil, unavailable("requested address %s is already allocated to container %s interface %s", want, cur.Owner.ID, cur.Owner.IfName)
			}
			got = want
		} else {
			got, rng = rs.NextFree(tx.LastReserved(idx), tx.Taken)
			if got == nil {
				return nil, unavailable("no free address left in range set %d (%s) of network %s", idx, rs, conf.Network)
			}
		}
		if err := tx.Reserve(store.Allocation{IP: got, Owner: o, RangeSet: idx}); err != nil {
			return nil, err
		}
		if err := tx.SetLastReserved(idx, got); err != nil {
			return nil, err
		}
		out = append(out, &current.IPConfig{
			Address: net.IPNet{IP: got, Mask: rng.Subnet.Mask},
			Gateway: rng.Gateway,
		})
	}
	return out, nil
}

// checkRequested: every requested address must fall in a range set, and no
// two in the same one (ADD takes one address per set).
func checkRequested(conf *config.IPAM) error {
	perSet := map[int][]net.IP{}
	for _, r := range conf.Requested {
		idx := -1
		for i, rs := range conf.Ranges {
			if rs.Contains(r) {
				idx = i
				break
			}
		}
		if idx < 0 {
			return cnierr.Config("requested address %s is in none of the range sets of network %s (%s)", r, conf.Network, rangeSets(conf.Ranges))
		}
		perSet[idx] = append(perSet[idx], r)
		if len(perSet[idx]) > 1 {
			return cnierr.Config("requested addresses %s fall in the same range set %d of network %s: one address is allocated per set", joinIPs(perSet[idx]), idx, conf.Network)
		}
	}
	return nil
}

// Del releases what the container holds on this network.
func Del(args *skel.CmdArgs) error {
	conf, err := config.Load(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	if _, err := os.Stat(store.Dir(conf.DataDir, conf.Network)); errors.Is(err, os.ErrNotExist) {
		return nil // nothing was ever allocated on this network
	}
	s, err := store.Open(conf.DataDir, conf.Network, conf.LockTimeout)
	if err != nil {
		return err
	}
	defer s.Close()
	return s.Update(func(tx *store.Tx) error {
		released, err := tx.ReleaseOwner(owner(args))
		if len(released) > 0 {
			slog.Info("released", "ips", allocList(released))
		}
		return err
	})
}

// Check verifies the container holds its prevResult addresses.
func Check(args *skel.CmdArgs) error {
	conf, err := config.Load(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	var prev *current.Result
	if conf.PrevResult != nil {
		if prev, err = current.NewResultFromResult(conf.PrevResult); err != nil {
			return cnierr.Field("prevResult", "%v", err)
		}
	}
	var held []store.Allocation
	if _, err := os.Stat(store.Dir(conf.DataDir, conf.Network)); err == nil {
		s, err := store.Open(conf.DataDir, conf.Network, conf.LockTimeout)
		if err != nil {
			return err
		}
		defer s.Close()
		if err := s.View(func(tx *store.Tx) error {
			held, err = tx.ByOwner(owner(args))
			return err
		}); err != nil {
			return err
		}
	}
	return verify(conf, owner(args), held, prev)
}

// verify is CHECK's decision: the container holds at least one address,
// and every prevResult address inside this network's ranges is one of its.
func verify(conf *config.IPAM, o store.Owner, held []store.Allocation, prev *current.Result) error {
	if len(held) == 0 {
		return cnierr.CheckFailed("container %s interface %s holds no address in network %s", o.ID, o.IfName, conf.Network)
	}
	if prev == nil {
		return nil
	}
	for _, ipc := range prev.IPs {
		a := ipc.Address.IP
		inRanges := false
		for _, rs := range conf.Ranges {
			inRanges = inRanges || rs.Contains(a)
		}
		if !inRanges {
			continue
		}
		found := false
		for _, h := range held {
			found = found || h.IP.Equal(a)
		}
		if !found {
			return cnierr.CheckFailed("address %s of prevResult is not held by container %s interface %s in network %s", a, o.ID, o.IfName, conf.Network)
		}
	}
	return nil
}

// validAttachments reads the attachments GC must keep: CNI 1.1's
// "cni.dev/valid-attachments", or the older "cni.dev/attachments". A null
// list is an empty one (libcni sends null when the runtime keeps nothing,
// and treats it so itself); a config with neither key is refused, so that
// a GC run by hand without the list cannot release everything.
func validAttachments(stdin []byte) ([]types.GCAttachment, error) {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(stdin, &keys); err != nil {
		return nil, cnierr.Decoding("config is not a JSON object: %v", err)
	}
	for _, k := range []string{"cni.dev/valid-attachments", "cni.dev/attachments"} {
		raw, ok := keys[k]
		if !ok {
			continue
		}
		var list []types.GCAttachment
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, cnierr.Field(k, "expected a list of {\"containerID\", \"ifname\"} objects: %v", err)
		}
		return list, nil
	}
	return nil, cnierr.Field("cni.dev/valid-attachments", "missing: GC needs the list of attachments to keep")
}

// GCAllocatedBefore is the key of a GC config (meshwire's own, beside
// CNI's "cni.dev/valid-attachments") that limits the GC to what was
// allocated before a time (RFC 3339): an allocation made after it is kept
// whatever the valid list says, as one of an ADD still under way, which no
// runtime's list holds yet (`meshwire gc --cri-socket`). An allocation of
// unknown time (made by an earlier version, or imported from the
// reference's files) counts as made before. Without the key, the valid
// list alone decides.
const GCAllocatedBefore = "meshwire.dev/gc-allocated-before"

// gcCutoff reads GCAllocatedBefore; zero when absent.
func gcCutoff(stdin []byte) (time.Time, error) {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(stdin, &keys); err != nil {
		return time.Time{}, cnierr.Decoding("config is not a JSON object: %v", err)
	}
	raw, ok := keys[GCAllocatedBefore]
	if !ok || string(raw) == "null" {
		return time.Time{}, nil
	}
	var at time.Time
	if err := json.Unmarshal(raw, &at); err != nil {
		return time.Time{}, cnierr.Field(GCAllocatedBefore, "expected an RFC 3339 time: %v", err)
	}
	return at, nil
}

// GC releases the allocations of attachments not in the valid list (made
// before the GCAllocatedBefore cutoff, when the config has one).
func GC(args *skel.CmdArgs) error {
	conf, err := config.Load(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	valid, err := validAttachments(args.StdinData)
	if err != nil {
		return err
	}
	cutoff, err := gcCutoff(args.StdinData)
	if err != nil {
		return err
	}
	if _, err := os.Stat(store.Dir(conf.DataDir, conf.Network)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	s, err := store.Open(conf.DataDir, conf.Network, conf.LockTimeout)
	if err != nil {
		return err
	}
	defer s.Close()
	return s.Update(func(tx *store.Tx) error {
		stale, err := collect(tx, valid, cutoff)
		if err != nil {
			return err
		}
		for _, a := range stale {
			if err := tx.Release(a); err != nil {
				return err
			}
		}
		if len(stale) > 0 {
			slog.Info("garbage collected", "ips", allocList(stale))
		}
		return nil
	})
}

// collect returns the allocations GC releases: those whose owner is not a
// valid attachment (an owner recorded with its container id alone is kept
// while any attachment of that container is valid) and, with a cutoff,
// that were not made after it.
func collect(tx *store.Tx, valid []types.GCAttachment, cutoff time.Time) ([]store.Allocation, error) {
	keep := map[store.Owner]bool{}
	for _, v := range valid {
		keep[store.Owner{ID: strings.TrimSpace(v.ContainerID), IfName: v.IfName}] = true
		keep[store.Owner{ID: strings.TrimSpace(v.ContainerID)}] = true
	}
	var stale []store.Allocation
	err := tx.ForEach(func(a store.Allocation) error {
		if !keep[a.Owner] && (cutoff.IsZero() || !a.Since.After(cutoff)) {
			stale = append(stale, a)
		}
		return nil
	})
	return stale, err
}

// Status reports whether ADD can succeed: the store is usable and every
// range set has a free address.
func Status(args *skel.CmdArgs) error {
	conf, err := config.Load(args.StdinData, "")
	if err != nil {
		return err
	}
	s, err := store.Open(conf.DataDir, conf.Network, conf.LockTimeout)
	if err != nil {
		if cnierr.Code(err) == cnierr.CodeTryAgainLater {
			return err
		}
		return cnierr.NotAvailable("host-local data directory %s is not usable: %v", store.Dir(conf.DataDir, conf.Network), err)
	}
	defer s.Close()
	return s.View(func(tx *store.Tx) error {
		return readiness(conf, tx.Taken)
	})
}

// readiness is STATUS's decision: ADD takes one address from every range
// set, so every set needs a free one.
func readiness(conf *config.IPAM, taken func(net.IP) bool) error {
	for i, rs := range conf.Ranges {
		if a, _ := rs.NextFree(nil, taken); a == nil {
			return cnierr.NotAvailable("range set %d (%s) of network %s has no free address", i, rs, conf.Network)
		}
	}
	return nil
}

// parseResolvConf reads a resolv.conf into the result's DNS, as the
// reference does.
func parseResolvConf(path string) (*types.DNS, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var dns types.DNS
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' || line[0] == ';' {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			continue
		}
		switch fields[0] {
		case "nameserver":
			dns.Nameservers = append(dns.Nameservers, fields[1])
		case "domain":
			dns.Domain = fields[1]
		case "search":
			dns.Search = append(dns.Search, fields[1:]...)
		case "options":
			dns.Options = append(dns.Options, fields[1:]...)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %v", path, err)
	}
	return &dns, nil
}

func joinIPs(ips []net.IP) string {
	s := make([]string, len(ips))
	for i, a := range ips {
		s[i] = a.String()
	}
	return strings.Join(s, ", ")
}

func rangeSets(sets []config.RangeSet) string {
	s := make([]string, len(sets))
	for i, rs := range sets {
		s[i] = rs.String()
	}
	return strings.Join(s, "; ")
}

func ipList(ips []*current.IPConfig) string {
	s := make([]string, len(ips))
	for i, c := range ips {
		s[i] = c.Address.String()
	}
	return strings.Join(s, ",")
}

func allocList(as []store.Allocation) string {
	s := make([]net.IP, len(as))
	for i, a := range as {
		s[i] = a.IP
	}
	return joinIPs(s)
}
