//go:build kernel

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/filelock"
	"github.com/meshwire/meshwire/internal/hostlocal/store"
	"github.com/meshwire/meshwire/test/harness"
)

// hostLocalNet is one host-local network with its own data directory,
// driven the way an interface plugin drives its IPAM plugin: the interface
// plugin's config on stdin and the CNI variables in the environment
// (pkg/invoke, which ipam.ExecAdd uses).
type hostLocalNet struct {
	h       *harness.H
	name    string
	dataDir string
	ipam    string // the ipam object without dataDir
}

func hostLocalNew(t *testing.T, h *harness.H, ipam string) *hostLocalNet {
	t.Helper()
	return &hostLocalNet{h: h, name: "mwt-hl-" + harness.RandomID()[:8], dataDir: t.TempDir(), ipam: ipam}
}

// conf is the stdin of the IPAM plugin: an interface plugin's config whose
// ipam object carries the data directory, plus extra top-level keys.
func (n *hostLocalNet) conf(cniVersion string, extra ...string) []byte {
	ipam := strings.Replace(n.ipam, "{", fmt.Sprintf(`{"dataDir":%q,`, n.dataDir), 1)
	s := fmt.Sprintf(`{"cniVersion":%q,"name":%q,"type":"bridge","ipam":%s`, cniVersion, n.name, ipam)
	for _, e := range extra {
		s += "," + e
	}
	return []byte(s + "}")
}

func (n *hostLocalNet) args(cmd, id, cniArgs string) *invoke.Args {
	return &invoke.Args{Command: cmd, ContainerID: id, NetNS: "/var/run/netns/mwt-hl-unused", IfName: "eth0", PluginArgsStr: cniArgs, Path: n.h.BinDir}
}

func (n *hostLocalNet) bin() string { return filepath.Join(n.h.BinDir, "host-local") }

// add runs ADD and returns the result in the current spec's form.
func (n *hostLocalNet) add(id, cniVersion, cniArgs string, extra ...string) (*current.Result, types.Result, error) {
	r, err := invoke.ExecPluginWithResult(context.Background(), n.bin(), n.conf(cniVersion, extra...), n.args("ADD", id, cniArgs), nil)
	if err != nil {
		return nil, nil, err
	}
	cr, err := current.NewResultFromResult(r)
	return cr, r, err
}

func (n *hostLocalNet) mustAdd(t *testing.T, id string, extra ...string) *current.Result {
	t.Helper()
	r, _, err := n.add(id, "1.1.0", "", extra...)
	if err != nil {
		t.Fatalf("ADD %s: %v", id, err)
	}
	return r
}

// run runs a command without a result (DEL, CHECK, GC, STATUS).
func (n *hostLocalNet) run(cmd, id, cniVersion string, extra ...string) error {
	return invoke.ExecPluginWithoutResult(context.Background(), n.bin(), n.conf(cniVersion, extra...), n.args(cmd, id, ""), nil)
}

// held lists the store's allocations as "address=id/ifname".
func (n *hostLocalNet) held(t *testing.T) []string {
	t.Helper()
	s, err := store.Open(n.dataDir, n.name, 10*time.Second)
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	defer s.Close()
	var out []string
	err = s.View(func(tx *store.Tx) error {
		if err := tx.Verify(); err != nil {
			return err
		}
		return tx.ForEach(func(a store.Allocation) error {
			out = append(out, fmt.Sprintf("%s=%s/%s", a.IP, a.Owner.ID, a.Owner.IfName))
			return nil
		})
	})
	if err != nil {
		t.Fatalf("store: %v", err)
	}
	return out
}

func hostLocalAddrs(r *current.Result) string {
	var s []string
	for _, ip := range r.IPs {
		s = append(s, ip.Address.String())
	}
	return strings.Join(s, " ")
}

func hostLocalPrev(t *testing.T, r types.Result) string {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return `"prevResult":` + string(b)
}

func hostLocalAssertCode(t *testing.T, err error, code uint, mention string) {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) || e.Code != code || !strings.Contains(e.Msg, mention) {
		t.Fatalf("got %v, want CNI error %d mentioning %q", err, code, mention)
	}
}

// TestHostLocalEveryVersion runs the life cycle for every spec version.
// Versions before 0.3.0 get one address per family (dual stack), later ones
// two IPv4 range sets as well.
func TestHostLocalEveryVersion(t *testing.T) {
	h := harness.New(t)
	for _, v := range version.All.SupportedVersions() {
		t.Run(v, func(t *testing.T) {
			sets := `[{"subnet":"198.18.0.0/24"}],[{"subnet":"fd10:0:0:1::/64"}]`
			want := "198.18.0.2/24 fd10:0:0:1::2/64"
			if gte(v, "0.3.0") {
				sets += `,[{"subnet":"198.18.1.0/24","rangeStart":"198.18.1.100"}]`
				want += " 198.18.1.100/24"
			}
			n := hostLocalNew(t, h, `{"type":"host-local","ranges":[`+sets+`],"routes":[{"dst":"198.18.8.0/24"}]}`)
			r, raw, err := n.add("c1", v, "")
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if raw.Version() != v {
				t.Fatalf("result version %s, want %s", raw.Version(), v)
			}
			if got := hostLocalAddrs(r); got != want {
				t.Fatalf("ADD addresses %q, want %q", got, want)
			}
			if r.IPs[0].Gateway.String() != "198.18.0.1" || len(r.Routes) != 1 || r.Routes[0].Dst.String() != "198.18.8.0/24" {
				t.Fatalf("gateway/routes: %+v %+v", r.IPs[0], r.Routes)
			}
			if gte(v, "0.4.0") {
				if err := n.run("CHECK", "c1", v, hostLocalPrev(t, raw)); err != nil {
					t.Fatalf("CHECK: %v", err)
				}
				err := n.run("CHECK", "c2", v, hostLocalPrev(t, raw))
				hostLocalAssertCode(t, err, 999, "holds no address")
			}
			if gte(v, "1.1.0") {
				if err := n.run("STATUS", "", v); err != nil {
					t.Fatalf("STATUS: %v", err)
				}
				if err := n.run("GC", "", v, `"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}]`); err != nil {
					t.Fatalf("GC: %v", err)
				}
				if len(n.held(t)) == 0 {
					t.Fatal("GC released a valid attachment")
				}
			}
			if err := n.run("DEL", "c1", v); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if held := n.held(t); len(held) != 0 {
				t.Fatalf("after DEL the store holds %v", held)
			}
			if err := n.run("DEL", "c1", v); err != nil {
				t.Fatalf("second DEL: %v", err)
			}
		})
	}
}

// hostLocalResolvConf writes a resolv.conf for the resolvConf key.
func hostLocalResolvConf(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "resolv.conf")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestHostLocalConfigForms: every way the reference accepts ranges and
// requested addresses, with the result a runtime sees.
func TestHostLocalConfigForms(t *testing.T) {
	h := harness.New(t)
	resolv := hostLocalResolvConf(t, "nameserver 198.18.0.53\nsearch mwt-hl.test\noptions ndots:3\n")
	cases := []struct {
		name    string
		ipam    string
		cniArgs string
		extra   []string
		want    string
	}{
		{"legacy single range", `{"type":"host-local","subnet":"198.18.2.0/24","rangeStart":"198.18.2.50","rangeEnd":"198.18.2.60","gateway":"198.18.2.254"}`, "", nil, "198.18.2.50/24"},
		{"ranges with two ranges in a set", `{"type":"host-local","ranges":[[{"subnet":"198.18.2.0/30"},{"subnet":"198.18.3.0/24"}]]}`, "", nil, "198.18.2.2/30"},
		{"ipRanges capability comes first", `{"type":"host-local","ranges":[[{"subnet":"198.18.2.0/24"}]]}`, "", []string{`"runtimeConfig":{"ipRanges":[[{"subnet":"fd10:0:0:3::/64"}]]}`}, "fd10:0:0:3::2/64 198.18.2.2/24"},
		{"ips capability", `{"type":"host-local","ranges":[[{"subnet":"198.18.2.0/24"}],[{"subnet":"fd10:0:0:3::/64"}]]}`, "", []string{`"runtimeConfig":{"ips":["198.18.2.77/24","fd10:0:0:3::77"]}`}, "198.18.2.77/24 fd10:0:0:3::77/64"},
		{"args.cni.ips", `{"type":"host-local","ranges":[[{"subnet":"198.18.2.0/24"}]]}`, "", []string{`"args":{"cni":{"ips":["198.18.2.88"]}}`}, "198.18.2.88/24"},
		{"CNI_ARGS IP=", `{"type":"host-local","ranges":[[{"subnet":"198.18.2.0/24"}]]}`, "IgnoreUnknown=1;K8S_POD_NAMESPACE=x;IP=198.18.2.99", nil, "198.18.2.99/24"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := hostLocalNew(t, h, c.ipam)
			r, _, err := n.add("c1", "1.0.0", c.cniArgs, c.extra...)
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if got := hostLocalAddrs(r); got != c.want {
				t.Fatalf("addresses %q, want %q", got, c.want)
			}
			if err := n.run("DEL", "c1", "1.0.0", c.extra...); err != nil {
				t.Fatalf("DEL: %v", err)
			}
		})
	}
	t.Run("routes and resolvConf", func(t *testing.T) {
		n := hostLocalNew(t, h, fmt.Sprintf(`{"type":"host-local","subnet":"198.18.2.0/24","resolvConf":%q,"routes":[{"dst":"0.0.0.0/0"},{"dst":"198.18.9.0/24","gw":"198.18.2.9"}]}`, resolv))
		r := n.mustAdd(t, "c1")
		if len(r.Routes) != 2 || r.Routes[1].GW.String() != "198.18.2.9" {
			t.Fatalf("routes %+v", r.Routes)
		}
		if strings.Join(r.DNS.Nameservers, ",") != "198.18.0.53" || strings.Join(r.DNS.Search, ",") != "mwt-hl.test" || strings.Join(r.DNS.Options, ",") != "ndots:3" {
			t.Fatalf("dns %+v", r.DNS)
		}
	})
}

// TestHostLocalErrors: exhaustion, taken and out-of-range requests, a second
// ADD, and broken input, each with its code and a message naming the cause;
// a failed ADD allocates nothing.
func TestHostLocalErrors(t *testing.T) {
	h := harness.New(t)
	n := hostLocalNew(t, h, `{"type":"host-local","ranges":[[{"subnet":"198.18.4.0/24"}],[{"subnet":"198.18.5.0/30"}]]}`)
	n.mustAdd(t, "c1")
	_, _, err := n.add("c1", "1.1.0", "")
	hostLocalAssertCode(t, err, 999, "second ADD")
	_, _, err = n.add("c2", "1.1.0", "")
	hostLocalAssertCode(t, err, 999, "no free address left in range set 1 (198.18.5.1-198.18.5.2)")
	_, _, err = n.add("c3", "1.1.0", "IP=198.18.4.2")
	hostLocalAssertCode(t, err, 999, "198.18.4.2 is already allocated to container c1")
	_, _, err = n.add("c3", "1.1.0", "", `"runtimeConfig":{"ips":["198.18.7.7"]}`)
	hostLocalAssertCode(t, err, 7, "198.18.7.7 is in none of the range sets")
	if held := n.held(t); len(held) != 2 {
		t.Fatalf("failed ADDs changed the store: %v", held)
	}

	// CHECK, DEL and GC on a network never used leave no state behind.
	fresh := hostLocalNew(t, h, n.ipam)
	hostLocalAssertCode(t, fresh.run("CHECK", "c1", "1.1.0"), 999, "holds no address")
	if err := fresh.run("DEL", "c1", "1.1.0"); err != nil {
		t.Fatalf("DEL on a fresh network: %v", err)
	}
	if err := fresh.run("GC", "", "1.1.0", `"cni.dev/valid-attachments":[]`); err != nil {
		t.Fatalf("GC on a fresh network: %v", err)
	}
	if _, err := os.Stat(store.Dir(fresh.dataDir, fresh.name)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("CHECK/DEL/GC on a fresh network created its directory (%v)", err)
	}

	env := func(cmd string) map[string]string {
		return map[string]string{"CNI_COMMAND": cmd, "CNI_CONTAINERID": "c9", "CNI_NETNS": "/var/run/netns/x", "CNI_IFNAME": "eth0", "CNI_PATH": h.BinDir}
	}
	cases := []struct {
		name  string
		cmd   string
		stdin string
		code  uint
		msg   string
	}{
		{"empty stdin", "ADD", "", 6, ""},
		{"invalid json", "ADD", `{"ipam":`, 6, ""},
		{"no ipam", "ADD", `{"cniVersion":"1.1.0","name":"mwt-hl-x","type":"bridge"}`, 7, "ipam"},
		{"/31", "ADD", `{"cniVersion":"1.1.0","name":"mwt-hl-x","type":"bridge","ipam":{"subnet":"198.18.4.0/31"}}`, 7, "too small"},
		{"/128", "ADD", `{"cniVersion":"1.1.0","name":"mwt-hl-x","type":"bridge","ipam":{"ranges":[[{"subnet":"fd10::1/128"}]]}}`, 7, "too small"},
		{"overlapping sets", "ADD", `{"cniVersion":"1.1.0","name":"mwt-hl-x","type":"bridge","ipam":{"ranges":[[{"subnet":"198.18.4.0/24"}],[{"subnet":"198.18.4.0/25"}]]}}`, 7, "overlaps"},
		{"two IPv4 at 0.2.0", "ADD", `{"cniVersion":"0.2.0","name":"mwt-hl-x","type":"bridge","ipam":{"ranges":[[{"subnet":"198.18.4.0/24"}],[{"subnet":"198.18.5.0/24"}]]}}`, 7, "one address per family"},
		{"GC without attachments", "GC", `{"cniVersion":"1.1.0","name":"mwt-hl-x","type":"bridge","ipam":{"subnet":"198.18.4.0/24"}}`, 7, "cni.dev/valid-attachments"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h.Exec("host-local", env(c.cmd), []byte(c.stdin)).WantCNIError(t, c.code, c.msg)
		})
	}
}

// TestHostLocalGC keeps exactly the valid attachments (new and old key).
func TestHostLocalGC(t *testing.T) {
	h := harness.New(t)
	for _, key := range []string{"cni.dev/valid-attachments", "cni.dev/attachments"} {
		t.Run(key, func(t *testing.T) {
			n := hostLocalNew(t, h, `{"type":"host-local","ranges":[[{"subnet":"198.18.6.0/24"}],[{"subnet":"fd10:0:0:6::/64"}]]}`)
			for _, id := range []string{"keep", "leak1", "leak2"} {
				n.mustAdd(t, id)
			}
			if err := n.run("GC", "", "1.1.0", fmt.Sprintf(`%q:[{"containerID":"keep","ifname":"eth0"},{"containerID":"leak1","ifname":"eth9"}]`, key)); err != nil {
				t.Fatalf("GC: %v", err)
			}
			held := n.held(t)
			if len(held) != 2 || !strings.HasSuffix(held[0], "=keep/eth0") || !strings.HasSuffix(held[1], "=keep/eth0") {
				t.Fatalf("after GC: %v", held)
			}
			// The released addresses are allocatable again once round-robin
			// wraps; the next ADD continues after the last one.
			r := n.mustAdd(t, "next")
			if hostLocalAddrs(r) != "198.18.6.5/24 fd10:0:0:6::5/64" {
				t.Fatalf("ADD after GC: %s", hostLocalAddrs(r))
			}
		})
	}
}

// TestHostLocalStatus: ready; not ready (50) when a set is full or the
// data directory is unusable.
func TestHostLocalStatus(t *testing.T) {
	h := harness.New(t)
	n := hostLocalNew(t, h, `{"type":"host-local","ranges":[[{"subnet":"198.18.7.0/24"}],[{"subnet":"198.18.8.0/30"}]]}`)
	if err := n.run("STATUS", "", "1.1.0"); err != nil {
		t.Fatalf("STATUS on a fresh network: %v", err)
	}
	n.mustAdd(t, "c1")
	hostLocalAssertCode(t, n.run("STATUS", "", "1.1.0"), 50, "range set 1 (198.18.8.1-198.18.8.2)")
	if err := n.run("DEL", "c1", "1.1.0"); err != nil {
		t.Fatal(err)
	}
	if err := n.run("STATUS", "", "1.1.0"); err != nil {
		t.Fatalf("STATUS after DEL: %v", err)
	}
	blocked := hostLocalNew(t, h, n.ipam)
	if err := os.WriteFile(filepath.Join(blocked.dataDir, blocked.name), []byte("not a directory"), 0o600); err != nil {
		t.Fatal(err)
	}
	hostLocalAssertCode(t, blocked.run("STATUS", "", "1.1.0"), 50, "not usable")
}

// TestHostLocalLockTimeout: with the store's lock held elsewhere, commands
// end with code 11 within the configured bound instead of hanging.
func TestHostLocalLockTimeout(t *testing.T) {
	h := harness.New(t)
	n := hostLocalNew(t, h, `{"type":"host-local","subnet":"198.18.9.0/24","lockTimeout":"300ms"}`)
	n.mustAdd(t, "c1")
	l, err := filelock.Acquire(filepath.Join(store.Dir(n.dataDir, n.name), store.LockName), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	start := time.Now()
	_, _, err = n.add("c2", "1.1.0", "")
	hostLocalAssertCode(t, err, 11, "try again")
	hostLocalAssertCode(t, n.run("DEL", "c1", "1.1.0"), 11, "try again")
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("two commands with a 300ms bound took %s", d)
	}
	l.Release()
	if err := n.run("DEL", "c1", "1.1.0"); err != nil {
		t.Fatalf("DEL once the lock is free: %v", err)
	}
}

// TestHostLocalReferenceDataDir: a data directory written by the reference
// plugin itself (an upgraded node) keeps its allocations: meshwire never
// hands them out again, CHECK and DEL find them by container id, GC
// collects them, and round-robin continues where the reference stopped.
func TestHostLocalReferenceDataDir(t *testing.T) {
	h := harness.New(t)
	n := hostLocalNew(t, h, `{"type":"host-local","ranges":[[{"subnet":"198.18.10.0/24"}]]}`)
	ref := filepath.Join(harness.ReferenceDir, "host-local")
	for _, id := range []string{"ref1", "ref2", "ref3"} {
		if _, err := invoke.ExecPluginWithResult(context.Background(), ref, n.conf("1.0.0"), n.args("ADD", id, ""), nil); err != nil {
			t.Fatalf("reference ADD %s: %v", id, err)
		}
	}
	r := n.mustAdd(t, "mw1")
	if got := hostLocalAddrs(r); got != "198.18.10.5/24" {
		t.Fatalf("meshwire ADD after three reference ADDs got %s, want 198.18.10.5/24", got)
	}
	want := []string{"198.18.10.2=ref1/eth0", "198.18.10.3=ref2/eth0", "198.18.10.4=ref3/eth0", "198.18.10.5=mw1/eth0"}
	if held := n.held(t); strings.Join(held, " ") != strings.Join(want, " ") {
		t.Fatalf("store %v, want %v", held, want)
	}
	if err := n.run("CHECK", "ref1", "1.0.0"); err != nil {
		t.Fatalf("CHECK of a reference allocation: %v", err)
	}
	if err := n.run("DEL", "ref2", "1.0.0"); err != nil {
		t.Fatalf("DEL of a reference allocation: %v", err)
	}
	dir := store.Dir(n.dataDir, n.name)
	if _, err := os.Stat(filepath.Join(dir, "198.18.10.3")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the reference file of ref2 survived its DEL (%v)", err)
	}
	if err := n.run("GC", "", "1.1.0", `"cni.dev/valid-attachments":[{"containerID":"ref1","ifname":"eth0"},{"containerID":"mw1","ifname":"eth0"}]`); err != nil {
		t.Fatalf("GC: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "198.18.10.4")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("GC left the reference file of ref3 (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "198.18.10.2")); err != nil {
		t.Fatalf("GC removed the valid ref1: %v", err)
	}
	want = []string{"198.18.10.2=ref1/eth0", "198.18.10.5=mw1/eth0"}
	if held := n.held(t); strings.Join(held, " ") != strings.Join(want, " ") {
		t.Fatalf("store after DEL and GC %v, want %v", held, want)
	}
}

// TestHostLocalConcurrent200: 200 ADD processes at once get 200 distinct
// addresses; then 100 DEL and 100 new ADD processes at once leave a
// consistent store with no address given twice.
func TestHostLocalConcurrent200(t *testing.T) {
	h := harness.New(t)
	n := hostLocalNew(t, h, `{"type":"host-local","ranges":[[{"subnet":"198.18.12.0/23"}],[{"subnet":"fd10:0:0:12::/64"}]]}`)
	var mu sync.Mutex
	got := map[string]string{}
	var failures []string
	var wg sync.WaitGroup
	addOne := func(id string) {
		defer wg.Done()
		r, _, err := n.add(id, "1.1.0", "")
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failures = append(failures, fmt.Sprintf("ADD %s: %v", id, err))
			return
		}
		for _, ip := range r.IPs {
			a := ip.Address.IP.String()
			if other, dup := got[a]; dup {
				failures = append(failures, fmt.Sprintf("%s given to %s and %s", a, other, id))
			}
			got[a] = id
		}
	}
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go addOne(fmt.Sprintf("c%03d", i))
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d failures, first: %s", len(failures), failures[0])
	}
	if len(got) != 400 {
		t.Fatalf("%d addresses handed out, want 400", len(got))
	}
	for i := 0; i < 100; i++ {
		wg.Add(2)
		go addOne(fmt.Sprintf("d%03d", i))
		go func(id string) {
			defer wg.Done()
			if err := n.run("DEL", id, "1.1.0"); err != nil {
				mu.Lock()
				failures = append(failures, fmt.Sprintf("DEL %s: %v", id, err))
				mu.Unlock()
			}
		}(fmt.Sprintf("c%03d", i))
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d failures, first: %s", len(failures), failures[0])
	}
	held := n.held(t)
	if len(held) != 400 {
		t.Fatalf("store holds %d addresses, want 400", len(held))
	}
	owners := map[string]int{}
	for _, e := range held {
		owners[strings.TrimSuffix(e[strings.Index(e, "=")+1:], "/eth0")]++
	}
	for i := 0; i < 100; i++ {
		if owners[fmt.Sprintf("c%03d", i)] != 0 {
			t.Fatalf("deleted container c%03d still holds addresses", i)
		}
		if owners[fmt.Sprintf("c%03d", i+100)] != 2 || owners[fmt.Sprintf("d%03d", i)] != 2 {
			t.Fatalf("c%03d or d%03d lacks its two addresses: %v", i+100, i, owners)
		}
	}
}

// hostLocalStart starts one ADD or DEL process without waiting for it.
func hostLocalStart(t *testing.T, n *hostLocalNet, command, id string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(n.bin())
	cmd.Env = []string{"CNI_COMMAND=" + command, "CNI_CONTAINERID=" + id, "CNI_NETNS=/var/run/netns/x", "CNI_IFNAME=eth0", "CNI_PATH=" + n.h.BinDir}
	cmd.Stdin = bytes.NewReader(n.conf("1.1.0"))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd
}

// TestHostLocalKill9: ADD and DEL processes killed at random points never
// leave a half-done change (a dual-stack container holds both addresses or
// none), nothing blocks later commands, and GC reclaims what the killed
// ones left.
func TestHostLocalKill9(t *testing.T) {
	h := harness.New(t)
	n := hostLocalNew(t, h, `{"type":"host-local","ranges":[[{"subnet":"198.18.14.0/24"}],[{"subnet":"fd10:0:0:14::/64"}]]}`)
	n.mustAdd(t, "survivor")
	const rounds = 30
	for i := 0; i < 2*rounds; i++ {
		n.mustAdd(t, fmt.Sprintf("deleted%02d", i))
	}
	rnd := rand.New(rand.NewSource(time.Now().UnixNano()))
	killed := 0
	for round := 0; round < rounds; round++ {
		var cmds []*exec.Cmd
		for k := 0; k < 2; k++ {
			cmds = append(cmds, hostLocalStart(t, n, "ADD", fmt.Sprintf("added%02d-%d", round, k)))
			cmds = append(cmds, hostLocalStart(t, n, "DEL", fmt.Sprintf("deleted%02d", 2*round+k)))
		}
		time.Sleep(time.Duration(rnd.Intn(6000)) * time.Microsecond)
		for _, c := range cmds {
			_ = c.Process.Signal(syscall.SIGKILL)
		}
		for _, c := range cmds {
			_ = c.Wait()
			if ws, ok := c.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				killed++
			}
		}
	}
	if killed == 0 {
		t.Fatal("no process was killed mid-operation; the test proves nothing")
	}
	perOwner := map[string]int{}
	for _, e := range n.held(t) { // held verifies the indexes agree
		perOwner[e[strings.Index(e, "=")+1:]]++
	}
	for o, c := range perOwner {
		if c != 2 {
			t.Fatalf("%s holds %d addresses: a killed ADD left a half-done allocation", o, c)
		}
	}
	t.Logf("%d of %d processes killed; %d containers hold their two addresses", killed, 4*rounds, len(perOwner))
	if err := n.run("GC", "", "1.1.0", `"cni.dev/valid-attachments":[{"containerID":"survivor","ifname":"eth0"}]`); err != nil {
		t.Fatalf("GC after the kills: %v", err)
	}
	if held := n.held(t); len(held) != 2 {
		t.Fatalf("after GC the store holds %v, want only the survivor's two addresses", held)
	}
	r := n.mustAdd(t, "after")
	if len(r.IPs) != 2 {
		t.Fatalf("ADD after the kills: %+v", r)
	}
}

// hostLocalReferenceCNI makes h run the reference bridge and ptp with
// meshwire's host-local as their IPAM plugin: a CNI path directory holding
// exactly those three binaries.
func hostLocalReferenceCNI(t *testing.T, h *harness.H) {
	t.Helper()
	dir := t.TempDir()
	links := map[string]string{
		"bridge":     filepath.Join(harness.ReferenceDir, "bridge"),
		"ptp":        filepath.Join(harness.ReferenceDir, "ptp"),
		"host-local": filepath.Join(h.BinDir, "host-local"),
	}
	for name, target := range links {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	h.CNIPath = []string{dir, harness.ReferenceDir}
	h.CNI = libcni.NewCNIConfigWithCacheDir(h.CNIPath, h.CacheDir, nil)
}

// TestHostLocalUnderReferenceBridge: the reference bridge plugin gets its
// addresses from meshwire's host-local; two namespaces on the bridge reach
// each other, CHECK passes through to host-local, DEL releases.
func TestHostLocalUnderReferenceBridge(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	const br = "mwt-hl-br0"
	t.Cleanup(func() { _, _ = harness.Run("ip", "link", "del", br) }) // the reference bridge plugin leaves its bridge
	hostLocalReferenceCNI(t, h)
	dataDir := t.TempDir()
	list := h.Single("1.0.0", "mwt-hl-bridge", fmt.Sprintf(`{"type":"bridge","bridge":%q,"ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"198.18.15.0/24"}],[{"subnet":"fd10:0:0:15::/64"}]]}}`, br, dataDir))
	ns1, ns2 := h.NewNS("hl"), h.NewNS("hl")
	a1 := h.Attach(list, ns1, "eth0", nil)
	a2 := h.Attach(list, ns2, "eth0", nil)
	r1 := a1.MustAdd()
	// CHECK before the second port joins: the reference bridge compares the
	// bridge's MAC with prevResult, and the kernel changes it as ports join.
	if err := a1.Check(); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	r2 := a2.MustAdd()
	if hostLocalAddrs(r1) != "198.18.15.2/24 fd10:0:0:15::2/64" || hostLocalAddrs(r2) != "198.18.15.3/24 fd10:0:0:15::3/64" {
		t.Fatalf("addresses %s and %s", hostLocalAddrs(r1), hostLocalAddrs(r2))
	}
	if addrs := ns2.Addrs("eth0"); !slices.Contains(addrs, "198.18.15.3/24") {
		t.Fatalf("ns2 eth0 has %v", addrs)
	}
	if _, err := os.Stat(filepath.Join(dataDir, "mwt-hl-bridge", store.DBName)); err != nil {
		t.Fatalf("meshwire's store was not used: %v", err)
	}
	if _, err := probePing(ns1.Path, "198.18.15.3"); err != nil {
		t.Fatalf("ns1 -> ns2 over the bridge: %v", err)
	}
	if err := a1.Del(); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	n := &hostLocalNet{h: h, name: "mwt-hl-bridge", dataDir: dataDir}
	if held := n.held(t); len(held) != 2 || !strings.Contains(held[0], a2.RT.ContainerID) {
		t.Fatalf("after DEL of ns1: %v", held)
	}
}

// TestHostLocalUnderReferencePtp: the same with the reference ptp plugin.
func TestHostLocalUnderReferencePtp(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	hostLocalReferenceCNI(t, h)
	dataDir := t.TempDir()
	list := h.Single("1.0.0", "mwt-hl-ptp", fmt.Sprintf(`{"type":"ptp","ipMasq":false,"ipam":{"type":"host-local","dataDir":%q,"subnet":"198.18.13.0/24","routes":[{"dst":"198.18.0.0/20","gw":"198.18.13.1"}]}}`, dataDir))
	ns := h.NewNS("hl")
	a := h.Attach(list, ns, "eth0", nil)
	r := a.MustAdd()
	if hostLocalAddrs(r) != "198.18.13.2/24" {
		t.Fatalf("address %s", hostLocalAddrs(r))
	}
	if addrs := ns.Addrs("eth0"); !slices.Contains(addrs, "198.18.13.2/24") {
		t.Fatalf("eth0 has %v", addrs)
	}
	var dsts []string
	for _, rt := range ns.Routes(netlink.FAMILY_V4) {
		if rt.Dst != nil {
			dsts = append(dsts, rt.Dst.String())
		}
	}
	sort.Strings(dsts)
	if !slices.Contains(dsts, "198.18.0.0/20") {
		t.Fatalf("routes in the namespace %v lack the configured 198.18.0.0/20", dsts)
	}
	if err := a.Check(); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if err := a.Del(); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	n := &hostLocalNet{h: h, name: "mwt-hl-ptp", dataDir: dataDir}
	if held := n.held(t); len(held) != 0 {
		t.Fatalf("after DEL: %v", held)
	}

	// The ips capability, as a runtime passes it: libcni puts it in
	// runtimeConfig for ptp, which hands its config to host-local.
	capList := h.ConfList(fmt.Sprintf(`{"cniVersion":"1.0.0","name":"mwt-hl-ptp","plugins":[{"type":"ptp","ipMasq":false,"capabilities":{"ips":true},"ipam":{"type":"host-local","dataDir":%q,"subnet":"198.18.13.0/24"}}]}`, dataDir))
	a = h.Attach(capList, h.NewNS("hl"), "eth0", map[string]any{"ips": []string{"198.18.13.50/24"}})
	if r := a.MustAdd(); hostLocalAddrs(r) != "198.18.13.50/24" {
		t.Fatalf("ADD with the ips capability got %s, want 198.18.13.50/24", hostLocalAddrs(r))
	}
	if addrs := a.NS.Addrs("eth0"); !slices.Contains(addrs, "198.18.13.50/24") {
		t.Fatalf("eth0 has %v", addrs)
	}
	if err := a.Del(); err != nil {
		t.Fatalf("DEL: %v", err)
	}
}

// TestHostLocalSameAsReference runs meshwire's and the reference's
// host-local on the same configs (each with its own data directory) and
// requires the same outcome: the same addresses, gateways, routes and DNS
// for two ADDs in a row, or a failure from both.
func TestHostLocalSameAsReference(t *testing.T) {
	h := harness.New(t)
	resolv := hostLocalResolvConf(t, "nameserver 198.18.0.53\ndomain mwt-hl.test\n")
	cases := []struct {
		ipam    string
		cniArgs string
		extra   []string
	}{
		{ipam: `{"type":"host-local","subnet":"198.18.16.0/24"}`},
		{ipam: `{"type":"host-local","subnet":"198.18.16.0/24","rangeStart":"198.18.16.200","gateway":"198.18.16.200"}`},
		{ipam: `{"type":"host-local","subnet":"198.18.16.0/30"}`},
		{ipam: `{"type":"host-local","subnet":"198.18.16.0/31"}`},
		{ipam: `{"type":"host-local","subnet":"198.18.16.1/24"}`},
		{ipam: `{"type":"host-local","subnet":"198.18.16.0/24","rangeEnd":"198.18.17.1"}`},
		{ipam: `{"type":"host-local","ranges":[[{"subnet":"198.18.16.0/29"},{"subnet":"198.18.17.0/29","gateway":"198.18.17.6"}]],"routes":[{"dst":"0.0.0.0/0"}]}`},
		{ipam: `{"type":"host-local","ranges":[[{"subnet":"198.18.16.0/24"}],[{"subnet":"fd10:0:0:16::/64"}]]}`},
		{ipam: `{"type":"host-local","ranges":[[{"subnet":"198.18.16.0/24"}],[{"subnet":"198.18.16.128/25"}]]}`},
		{ipam: `{"type":"host-local","ranges":[[{"subnet":"198.18.16.0/24"},{"subnet":"fd10:0:0:16::/64"}]]}`},
		{ipam: `{"type":"host-local","ranges":[[{"subnet":"fd10:0:0:16::/127"}]]}`},
		{ipam: fmt.Sprintf(`{"type":"host-local","subnet":"198.18.16.0/24","resolvConf":%q}`, resolv)},
		{ipam: `{"type":"host-local","subnet":"198.18.16.0/24"}`, cniArgs: "IP=198.18.16.9"},
		{ipam: `{"type":"host-local","subnet":"198.18.16.0/24"}`, cniArgs: "IP=198.18.16.1"},
		{ipam: `{"type":"host-local","subnet":"198.18.16.0/24"}`, cniArgs: "FOO=bar"},
		{ipam: `{"type":"host-local","subnet":"198.18.16.0/24"}`, cniArgs: "IgnoreUnknown=1;FOO=bar"},
		{ipam: `{"type":"host-local","subnet":"198.18.16.0/24"}`, extra: []string{`"args":{"cni":{"ips":["198.18.16.33"]}}`}},
		{ipam: `{"type":"host-local","subnet":"198.18.16.0/24"}`, extra: []string{`"runtimeConfig":{"ips":["198.18.99.1"]}`}},
		{ipam: `{"type":"host-local","subnet":"198.18.16.0/24"}`, extra: []string{`"runtimeConfig":{"ipRanges":[[{"subnet":"fd10:0:0:17::/120"}]]}`}},
		{ipam: `{"type":"host-local"}`},
	}
	ref := filepath.Join(harness.ReferenceDir, "host-local")
	for i, c := range cases {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			mw := hostLocalNew(t, h, c.ipam)
			rf := hostLocalNew(t, h, c.ipam)
			rf.name = mw.name
			for _, id := range []string{"c1", "c2"} {
				mr, merr := invoke.ExecPluginWithResult(context.Background(), mw.bin(), mw.conf("1.0.0", c.extra...), mw.args("ADD", id, c.cniArgs), nil)
				rr, rerr := invoke.ExecPluginWithResult(context.Background(), ref, rf.conf("1.0.0", c.extra...), rf.args("ADD", id, c.cniArgs), nil)
				if (merr == nil) != (rerr == nil) {
					t.Fatalf("%s ADD %s: meshwire %v, reference %v", c.ipam, id, merr, rerr)
				}
				if merr != nil {
					return
				}
				mj, _ := json.Marshal(mr)
				rj, _ := json.Marshal(rr)
				if string(mj) != string(rj) {
					t.Fatalf("%s ADD %s:\nmeshwire  %s\nreference %s", c.ipam, id, mj, rj)
				}
			}
		})
	}
}

// TestHostLocalSharesReferenceLock: meshwire locks the file the reference
// locks, so on a node in the middle of an upgrade the two never change a
// network's directory at the same time.
func TestHostLocalSharesReferenceLock(t *testing.T) {
	h := harness.New(t)
	n := hostLocalNew(t, h, `{"type":"host-local","subnet":"198.18.11.0/24"}`)
	n.mustAdd(t, "mw1") // creates the directory and the lock file
	l, err := filelock.AcquireQueued(filepath.Join(store.Dir(n.dataDir, n.name), store.LockName), time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	cmd := exec.Command(filepath.Join(harness.ReferenceDir, "host-local"))
	cmd.Env = []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=ref1", "CNI_NETNS=/var/run/netns/x", "CNI_IFNAME=eth0", "CNI_PATH=" + harness.ReferenceDir}
	cmd.Stdin = bytes.NewReader(n.conf("1.0.0"))
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("the reference ADD finished (%v: %s) while meshwire held the network's lock", err, out.String())
	case <-time.After(500 * time.Millisecond):
	}
	l.Release()
	if err := <-done; err != nil {
		t.Fatalf("reference ADD after the lock was released: %v: %s", err, out.String())
	}
	if !strings.Contains(out.String(), "198.18.11.") {
		t.Fatalf("reference ADD printed %s", out.String())
	}
}
