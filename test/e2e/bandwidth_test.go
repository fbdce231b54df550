//go:build kernel

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/link"
	"github.com/meshwire/meshwire/internal/probe"
	"github.com/meshwire/meshwire/test/harness"
)

// The bandwidth tests use 198.18.32.0/20 and links named mwtw*.

// bandwidthIface is an interface plugin the bandwidth plugin is chained
// after, with the CNI path that selects it.
type bandwidthIface struct {
	name      string
	reference bool   // run the reference plugins (bandwidth excepted)
	conf      string // plugin JSON with %s for the ipam object
	bridge    string // bridge the plugin creates on the host, removed at cleanup
}

var bandwidthIfaces = []bandwidthIface{
	{name: "ref-ptp", reference: true, conf: `{"type":"ptp","ipam":%s}`},
	{name: "ref-bridge", reference: true, conf: `{"type":"bridge","bridge":"mwtwbr0","isGateway":true,"ipam":%s}`, bridge: "mwtwbr0"},
	{name: "meshwire-veth", conf: `{"type":"veth","ipam":%s}`},
	{name: "meshwire-bridge", conf: `{"type":"bridge","bridge":"mwtwbr1","isGateway":true,"ipam":%s}`, bridge: "mwtwbr1"},
}

// bandwidthNet is one network (conflist) of the tests: an interface plugin
// then, for shaped pods, meshwire's bandwidth plugin.
type bandwidthNet struct {
	h        *harness.H
	name     string
	version  string
	iface    bandwidthIface
	ipamDir  string
	subnet   string
	bwConf   string // bandwidth plugin JSON
	shaped   *libcni.NetworkConfigList
	unshaped *libcni.NetworkConfigList
}

// bandwidthHarness returns a harness whose CNI path holds meshwire's
// bandwidth plugin and, for reference interface plugins, the reference
// suite (so that "bridge" and "host-local" are the reference ones even when
// meshwire ships plugins of the same name).
func bandwidthHarness(t *testing.T, iface bandwidthIface) *harness.H {
	h := harness.New(t, harness.ReferenceDir)
	if !iface.reference {
		return h
	}
	dir := t.TempDir()
	entries, err := os.ReadDir(harness.ReferenceDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() == "bandwidth" {
			continue
		}
		if err := os.Symlink(filepath.Join(harness.ReferenceDir, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(h.BinDir, "bandwidth"), filepath.Join(dir, "bandwidth")); err != nil {
		t.Fatal(err)
	}
	h.CNIPath = []string{dir}
	h.CNI = libcni.NewCNIConfigWithCacheDir(h.CNIPath, h.CacheDir, nil)
	return h
}

func newBandwidthNet(t *testing.T, h *harness.H, iface bandwidthIface, version, name, subnet, bwConf string) *bandwidthNet {
	n := &bandwidthNet{h: h, name: name, version: version, iface: iface, ipamDir: t.TempDir(), subnet: subnet, bwConf: bwConf}
	if iface.bridge != "" {
		t.Cleanup(func() {
			if l, err := netlink.LinkByName(iface.bridge); err == nil {
				_ = netlink.LinkDel(l)
			}
		})
	}
	ipam := fmt.Sprintf(`{"type":"host-local","ranges":[[{"subnet":%q}]],"dataDir":%q}`, subnet, n.ipamDir)
	ifc := fmt.Sprintf(iface.conf, ipam)
	n.shaped = h.ConfList(fmt.Sprintf(`{"cniVersion":%q,"name":%q,"plugins":[%s,%s]}`, n.version, name, ifc, bwConf))
	n.unshaped = h.ConfList(fmt.Sprintf(`{"cniVersion":%q,"name":%q,"plugins":[%s]}`, n.version, name, ifc))
	return n
}

// bandwidthPod is an attached namespace with its address and host end.
type bandwidthPod struct {
	ns   *harness.NS
	att  *harness.Attachment
	res  *current.Result
	ip   net.IP
	host string // host end of the veth
}

func (n *bandwidthNet) pod(t *testing.T, shaped bool, caps map[string]any) *bandwidthPod {
	t.Helper()
	list := n.unshaped
	if shaped {
		list = n.shaped
	}
	ns := n.h.NewNS("bw")
	a := n.h.Attach(list, ns, "eth0", caps)
	res := a.MustAdd()
	p := &bandwidthPod{ns: ns, att: a, res: res}
	for _, ip := range res.IPs {
		if ip.Address.IP.To4() != nil {
			p.ip = ip.Address.IP
		}
	}
	if p.ip == nil {
		t.Fatalf("no IPv4 address in %+v", res)
	}
	p.host = bandwidthHostEnd(t, ns)
	return p
}

// bandwidthBarePod attaches one pod to the reference ptp without shaping,
// for tests that run the bandwidth binary on it directly.
func bandwidthBarePod(t *testing.T, name, subnet string) (*harness.H, *bandwidthNet, *bandwidthPod) {
	t.Helper()
	h := bandwidthHarness(t, bandwidthRefPtp)
	h.CheckNoLeaks()
	n := newBandwidthNet(t, h, bandwidthRefPtp, "1.0.0", name, subnet, `{"type":"bandwidth"}`)
	return h, n, n.pod(t, false, nil)
}

// bandwidthHostEnd finds the host end of eth0 in ns the way the kernel
// tells it (the veth's peer index), independently of the plugin's code.
func bandwidthHostEnd(t *testing.T, ns *harness.NS) string {
	t.Helper()
	// Not ns.Netlink(): a netlink socket kept open inside the namespace
	// would keep it (and the veth) alive after `ip netns del`.
	var idx int
	if err := ns.Do(func() error {
		l, err := netlink.LinkByName("eth0")
		if err == nil {
			idx = l.Attrs().ParentIndex
		}
		return err
	}); err != nil {
		t.Fatalf("eth0 in %s: %v", ns.Name, err)
	}
	peer, err := netlink.LinkByIndex(idx)
	if err != nil {
		t.Fatalf("host end of eth0 in %s: %v", ns.Name, err)
	}
	return peer.Attrs().Name
}

// bandwidthIfbs lists the host's ifb devices with meshwire's prefix.
func bandwidthIfbs(t *testing.T) map[string]string {
	t.Helper()
	links, err := netlinksafe.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, l := range links {
		if l.Type() == "ifb" && strings.HasPrefix(l.Attrs().Name, "mwbw") {
			out[l.Attrs().Name] = l.Attrs().Alias
		}
	}
	return out
}

// bandwidthIfbsOf lists the meshwire ifb devices made for the pod's
// attachment (other tests on the host may have their own).
func bandwidthIfbsOf(t *testing.T, p *bandwidthPod) []string {
	t.Helper()
	var out []string
	for name, alias := range bandwidthIfbs(t) {
		if strings.Contains(alias, " id="+p.att.RT.ContainerID) {
			out = append(out, name)
		}
	}
	return out
}

// bandwidthRootTbf returns the tbf at the root of a host link, nil if none.
func bandwidthRootTbf(t *testing.T, name string) *netlink.Tbf {
	t.Helper()
	l, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatalf("link %s: %v", name, err)
	}
	qs, err := netlinksafe.QdiscList(l)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range qs {
		if tbf, ok := q.(*netlink.Tbf); ok && q.Attrs().Parent == netlink.HANDLE_ROOT {
			return tbf
		}
	}
	return nil
}

// bandwidthIfbOf returns the ifb the host end's ingress redirects to ("" if
// none), read from the kernel's filters.
func bandwidthIfbOf(t *testing.T, host string) string {
	t.Helper()
	l, err := netlink.LinkByName(host)
	if err != nil {
		t.Fatalf("link %s: %v", host, err)
	}
	for _, parent := range []uint32{netlink.MakeHandle(0xffff, 0), netlink.HANDLE_MIN_INGRESS} {
		fs, err := netlinksafe.FilterList(l, parent)
		if err != nil {
			continue
		}
		for _, f := range fs {
			u, ok := f.(*netlink.U32)
			if !ok {
				continue
			}
			for _, a := range u.Actions {
				if m, ok := a.(*netlink.MirredAction); ok {
					if ifb, err := netlink.LinkByIndex(m.Ifindex); err == nil {
						return ifb.Attrs().Name
					}
				}
			}
		}
	}
	return ""
}

// bandwidthTransfer sends n bytes over TCP from one namespace to an address
// in another and returns the rate the receiver saw, in bit/s, from its
// first read to its last.
func bandwidthTransfer(t *testing.T, from, to *harness.NS, toIP net.IP, n int) float64 {
	t.Helper()
	ln, err := probe.Listen(to.Path, "tcp4", net.JoinHostPort(toIP.String(), "0"))
	if err != nil {
		t.Fatalf("listen in %s: %v", to.Name, err)
	}
	defer ln.Close()
	type result struct {
		bps float64
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(60 * time.Second))
		buf := make([]byte, 64<<10)
		var first, last time.Time
		total, firstN := 0, 0
		for {
			k, err := c.Read(buf)
			if k > 0 {
				now := time.Now()
				if first.IsZero() {
					first, firstN = now, k
				}
				last = now
				total += k
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				done <- result{err: err}
				return
			}
		}
		if total != n || !last.After(first) {
			done <- result{err: fmt.Errorf("received %d of %d bytes", total, n)}
			return
		}
		done <- result{bps: float64(total-firstN) * 8 / last.Sub(first).Seconds()}
	}()
	c, err := probe.Dial(from.Path, "tcp4", ln.Addr().String(), 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", ln.Addr(), from.Name, err)
	}
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := c.Write(make([]byte, n)); err != nil {
		c.Close()
		t.Fatalf("send: %v", err)
	}
	c.Close()
	r := <-done
	if r.err != nil {
		t.Fatalf("transfer %s -> %s: %v", from.Name, to.Name, r.err)
	}
	return r.bps
}

// bandwidthExec runs the bandwidth binary directly with a config holding a
// prevResult (what libcni does inside a conflist), for the cases a conflist
// cannot express: another tc user between the interface plugin and
// bandwidth, GC and STATUS with a 1.1.0 config.
func bandwidthExec(t *testing.T, h *harness.H, cmd string, p *bandwidthPod, conf map[string]any) (*harness.ExecResult, error) {
	t.Helper()
	env := map[string]string{"CNI_COMMAND": cmd, "CNI_PATH": h.BinDir, "CNI_IFNAME": "eth0", "CNI_CONTAINERID": "none"}
	if p != nil {
		env["CNI_CONTAINERID"] = p.att.RT.ContainerID
		env["CNI_NETNS"] = p.ns.Path
		if p.res != nil {
			prev, err := p.res.GetAsVersion(conf["cniVersion"].(string))
			if err != nil {
				t.Fatal(err)
			}
			conf["prevResult"] = prev
		}
	}
	stdin, err := json.Marshal(conf)
	if err != nil {
		t.Fatal(err)
	}
	r := h.Exec("bandwidth", env, stdin)
	if r.ExitCode != 0 {
		e, err := r.CNIError()
		if err != nil {
			t.Fatalf("%s: %v (stderr %s)", cmd, err, r.Stderr)
		}
		return &r, e
	}
	return &r, nil
}

func bandwidthConf(name, version string, extra map[string]any) map[string]any {
	c := map[string]any{"cniVersion": version, "name": name, "type": "bandwidth"}
	for k, v := range extra {
		c[k] = v
	}
	return c
}

func bandwidthWantTbf(t *testing.T, dev string, rateBits uint64) {
	t.Helper()
	tbf := bandwidthRootTbf(t, dev)
	if tbf == nil {
		t.Fatalf("no tbf at the root of %s", dev)
	}
	if tbf.Rate != rateBits/8 {
		t.Fatalf("tbf on %s: rate %d bytes/s, want %d", dev, tbf.Rate, rateBits/8)
	}
}

// TestBandwidthShapesTraffic: both directions shaped at a low rate, checked
// with real TCP transfers between the pod and a second, unshaped pod, for
// each interface plugin bandwidth can follow. Without shaping the transfers
// run at several Gbit/s and the test fails.
func TestBandwidthShapesTraffic(t *testing.T) {
	const rate = 4_000_000 // bit/s
	for i, iface := range bandwidthIfaces {
		t.Run(iface.name, func(t *testing.T) {
			h := bandwidthHarness(t, iface)
			h.CheckNoLeaks()
			bw := fmt.Sprintf(`{"type":"bandwidth","ingressRate":%d,"ingressBurst":32000,"egressRate":%d,"egressBurst":32000}`, rate, rate)
			n := newBandwidthNet(t, h, iface, "1.0.0", "bw-traffic", fmt.Sprintf("198.18.%d.0/24", 32+i), bw)
			pod := n.pod(t, true, nil)
			peer := n.pod(t, false, nil)

			bandwidthWantTbf(t, pod.host, rate)
			ifb := bandwidthIfbOf(t, pod.host)
			if !strings.HasPrefix(ifb, "mwbw") {
				t.Fatalf("%s's ingress does not redirect to a meshwire ifb (got %q)", pod.host, ifb)
			}
			bandwidthWantTbf(t, ifb, rate)
			if !bandwidthHasIfbIface(pod.res, ifb) {
				t.Fatalf("ADD result does not list %s: %+v", ifb, pod.res.Interfaces)
			}
			if err := pod.att.Check(); err != nil {
				t.Fatalf("CHECK: %v", err)
			}

			const size = 512 << 10 // about 1 s at 4 Mbit/s
			for _, dir := range []struct {
				name     string
				from, to *bandwidthPod
			}{{"ingress", peer, pod}, {"egress", pod, peer}} {
				got := bandwidthTransfer(t, dir.from.ns, dir.to.ns, dir.to.ip, size)
				t.Logf("%s: %.2f Mbit/s through a %d Mbit/s limit", dir.name, got/1e6, rate/1_000_000)
				if got > 1.3*rate || got < 0.5*rate {
					t.Fatalf("%s: %.2f Mbit/s, want about %d Mbit/s", dir.name, got/1e6, rate/1_000_000)
				}
			}
			if err := pod.att.Del(); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if _, ok := bandwidthIfbs(t)[ifb]; ok {
				t.Fatalf("%s still exists after DEL", ifb)
			}
			if err := pod.att.Del(); err != nil {
				t.Fatalf("second DEL: %v", err)
			}
		})
	}
}

func bandwidthHasIfbIface(r *current.Result, name string) bool {
	for _, i := range r.Interfaces {
		if i.Name == name && i.Sandbox == "" {
			return true
		}
	}
	return false
}

var bandwidthRefPtp = bandwidthIfaces[0]

// TestBandwidthRuntimeConfigWins: the runtime's bandwidth capability replaces
// the plugin config's limits; containerd's form (capitalised keys, zeros for
// the direction a pod does not limit) is understood.
func TestBandwidthRuntimeConfigWins(t *testing.T) {
	h := bandwidthHarness(t, bandwidthRefPtp)
	h.CheckNoLeaks()
	bw := `{"type":"bandwidth","capabilities":{"bandwidth":true},"ingressRate":1000000,"ingressBurst":100000,"egressRate":1000000,"egressBurst":100000}`
	n := newBandwidthNet(t, h, bandwidthRefPtp, "1.0.0", "bw-rt", "198.18.47.0/24", bw)

	plain := n.pod(t, true, nil)
	bandwidthWantTbf(t, plain.host, 1_000_000)
	bandwidthWantTbf(t, bandwidthIfbOf(t, plain.host), 1_000_000)

	rt := n.pod(t, true, map[string]any{"bandwidth": map[string]any{
		"ingressRate": 3_000_000, "ingressBurst": 300_000, "egressRate": 2_000_000, "egressBurst": 200_000}})
	bandwidthWantTbf(t, rt.host, 3_000_000)
	bandwidthWantTbf(t, bandwidthIfbOf(t, rt.host), 2_000_000)
	if err := rt.att.Check(); err != nil {
		t.Fatalf("CHECK with runtime config: %v", err)
	}

	// containerd: {"IngressRate":..,"IngressBurst":4294967295,"EgressRate":0,"EgressBurst":0}
	ctrd := n.pod(t, true, map[string]any{"bandwidth": map[string]any{
		"IngressRate": 5_000_000, "IngressBurst": uint64(1<<32 - 1), "EgressRate": 0, "EgressBurst": 0}})
	bandwidthWantTbf(t, ctrd.host, 5_000_000)
	if ifb := bandwidthIfbOf(t, ctrd.host); ifb != "" {
		t.Fatalf("egress not limited by the runtime, yet %s redirects to %s", ctrd.host, ifb)
	}
	if err := ctrd.att.Check(); err != nil {
		t.Fatalf("CHECK with containerd's runtime config: %v", err)
	}
}

// TestBandwidthCheckDetectsChanges: CHECK fails when the rate, the burst or
// the wiring no longer match the config.
func TestBandwidthCheckDetectsChanges(t *testing.T) {
	h := bandwidthHarness(t, bandwidthRefPtp)
	h.CheckNoLeaks()
	bw := `{"type":"bandwidth","ingressRate":8000000,"ingressBurst":80000,"egressRate":8000000,"egressBurst":80000}`
	n := newBandwidthNet(t, h, bandwidthRefPtp, "1.0.0", "bw-check", "198.18.41.0/24", bw)
	pod := n.pod(t, true, nil)
	if err := pod.att.Check(); err != nil {
		t.Fatalf("CHECK after ADD: %v", err)
	}
	ifb := bandwidthIfbOf(t, pod.host)
	steps := []struct {
		name, dev, want string
		change          func(*netlink.Tbf)
	}{
		{"ingress rate", pod.host, "rate", func(q *netlink.Tbf) { q.Rate *= 2 }},
		{"egress rate", ifb, "rate", func(q *netlink.Tbf) { q.Rate /= 2 }},
		{"egress burst", ifb, "bucket", func(q *netlink.Tbf) { q.Buffer *= 2 }},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			tbf := bandwidthRootTbf(t, s.dev)
			saved := *tbf
			s.change(tbf)
			if err := netlink.QdiscReplace(tbf); err != nil {
				t.Fatal(err)
			}
			err := pod.att.Check()
			if rerr := netlink.QdiscReplace(&saved); rerr != nil {
				t.Fatal(rerr)
			}
			if err == nil || !strings.Contains(err.Error(), s.want) {
				t.Fatalf("CHECK after changing the %s: got %v, want an error about the %s", s.name, err, s.want)
			}
			if err := pod.att.Check(); err != nil {
				t.Fatalf("CHECK after restoring: %v", err)
			}
		})
	}
	t.Run("redirect removed", func(t *testing.T) {
		l, _ := netlink.LinkByName(pod.host)
		fs, err := netlinksafe.FilterList(l, netlink.MakeHandle(0xffff, 0))
		if err != nil || len(fs) == 0 {
			t.Fatalf("filters of %s: %v %v", pod.host, fs, err)
		}
		for _, f := range fs {
			if err := netlink.FilterDel(f); err != nil {
				t.Fatal(err)
			}
		}
		err = pod.att.Check()
		if err == nil || !strings.Contains(err.Error(), "redirect") {
			t.Fatalf("CHECK without the redirect: got %v", err)
		}
	})
}

// TestBandwidthDelAndGC: DEL and GC remove exactly their ifb devices, also
// with the pod's namespace gone, and never another network's.
func TestBandwidthDelAndGC(t *testing.T) {
	h := bandwidthHarness(t, bandwidthRefPtp)
	h.CheckNoLeaks()
	bw := `{"type":"bandwidth","egressRate":10000000,"egressBurst":100000}`
	a := newBandwidthNet(t, h, bandwidthRefPtp, "1.0.0", "bw-gc-a", "198.18.42.0/24", bw)
	b := newBandwidthNet(t, h, bandwidthRefPtp, "1.0.0", "bw-gc-b", "198.18.43.0/24", bw)
	keep, stale, other := a.pod(t, true, nil), a.pod(t, true, nil), b.pod(t, true, nil)
	ifbOf := map[*bandwidthPod]string{}
	for _, p := range []*bandwidthPod{keep, stale, other} {
		ifbOf[p] = bandwidthIfbOf(t, p.host)
		if ifbOf[p] == "" {
			t.Fatalf("no ifb for %s", p.host)
		}
	}

	gcConf := bandwidthConf(a.name, "1.1.0", map[string]any{"egressRate": 10000000, "egressBurst": 100000,
		"cni.dev/valid-attachments": []map[string]string{{"containerID": keep.att.RT.ContainerID, "ifname": "eth0"}}})
	if _, err := bandwidthExec(t, h, "GC", nil, gcConf); err != nil {
		t.Fatalf("GC: %v", err)
	}
	have := bandwidthIfbs(t)
	for p, want := range map[*bandwidthPod]bool{keep: true, stale: false, other: true} {
		if _, ok := have[ifbOf[p]]; ok != want {
			t.Fatalf("after GC: %s exists=%v, want %v (all: %v)", ifbOf[p], ok, want, have)
		}
	}
	if bandwidthIfbOf(t, stale.host) != "" {
		t.Fatalf("GC left the redirect on %s", stale.host)
	}

	// DEL with the namespace gone: the veth went with it; the ifb must go too.
	if out, err := harness.Run("ip", "netns", "del", keep.ns.Name); err != nil {
		t.Fatalf("ip netns del: %v: %s", err, out)
	}
	bandwidthDropVeth(t, keep.host)
	if err := keep.att.Del(); err != nil {
		t.Fatalf("DEL after the namespace was deleted: %v", err)
	}
	if err := keep.att.Del(); err != nil {
		t.Fatalf("second DEL: %v", err)
	}
	have = bandwidthIfbs(t)
	if _, ok := have[ifbOf[keep]]; ok {
		t.Fatalf("DEL left %s", ifbOf[keep])
	}
	if _, ok := have[ifbOf[other]]; !ok {
		t.Fatalf("DEL of network a removed network b's %s", ifbOf[other])
	}
	if err := other.att.Del(); err != nil {
		t.Fatal(err)
	}
	if _, ok := bandwidthIfbs(t)[ifbOf[other]]; ok {
		t.Fatalf("DEL left %s", ifbOf[other])
	}
	// STATUS is ready.
	if _, err := bandwidthExec(t, h, "STATUS", nil, bandwidthConf(a.name, "1.1.0", nil)); err != nil {
		t.Fatalf("STATUS: %v", err)
	}
}

// TestBandwidthCoexistence: an ingress (or clsact) qdisc already on the
// host end is shared, not a "file exists" failure, and DEL leaves it and its
// filters as they were; a root qdisc meshwire did not create is refused,
// never replaced.
func TestBandwidthCoexistence(t *testing.T) {
	for _, kind := range []string{"ingress", "clsact"} {
		t.Run(kind, func(t *testing.T) {
			h, n, pod := bandwidthBarePod(t, "bw-coexist", "198.18.44.0/24")
			parent := netlink.MakeHandle(0xffff, 0)
			if kind == "clsact" {
				parent = netlink.HANDLE_MIN_INGRESS
			}
			if out, err := harness.Run("tc", "qdisc", "add", "dev", pod.host, kind); err != nil {
				t.Fatalf("tc qdisc add %s: %v: %s", kind, err, out)
			}
			// Someone else's filter: classify ICMP (no action).
			if out, err := harness.Run("tc", "filter", "add", "dev", pod.host, "parent", netlink.HandleStr(parent), "prio", "100", "protocol", "ip",
				"u32", "match", "ip", "protocol", "1", "0xff", "flowid", "1:1"); err != nil {
				t.Fatalf("tc filter add: %v: %s", err, out)
			}
			conf := bandwidthConf(n.name, "1.0.0", map[string]any{"egressRate": 10000000, "egressBurst": 100000})
			r, err := bandwidthExec(t, h, "ADD", pod, conf)
			if err != nil {
				t.Fatalf("ADD with an existing %s qdisc: %v", kind, err)
			}
			var res current.Result
			if err := json.Unmarshal(r.Stdout, &res); err != nil {
				t.Fatal(err)
			}
			ifb := bandwidthIfbOf(t, pod.host)
			if !strings.HasPrefix(ifb, "mwbw") {
				t.Fatalf("no redirect to a meshwire ifb on %s", pod.host)
			}
			delCheck := func(cmd string) {
				t.Helper()
				if _, err := bandwidthExec(t, h, cmd, pod, conf); err != nil {
					t.Fatalf("%s: %v", cmd, err)
				}
			}
			delCheck("CHECK")
			delCheck("DEL")
			if _, ok := bandwidthIfbs(t)[ifb]; ok {
				t.Fatalf("DEL left %s", ifb)
			}
			out, _ := harness.Run("tc", "qdisc", "show", "dev", pod.host)
			if !strings.Contains(out, kind) {
				t.Fatalf("DEL removed the %s qdisc meshwire did not create:\n%s", kind, out)
			}
			out, _ = harness.Run("tc", "filter", "show", "dev", pod.host, "parent", netlink.HandleStr(parent))
			if !strings.Contains(out, "pref 100") || strings.Contains(out, "mirred") {
				t.Fatalf("filters after DEL should be exactly the foreign one:\n%s", out)
			}
			delCheck("DEL")
		})
	}
	t.Run("foreign root qdisc", func(t *testing.T) {
		h, n, pod := bandwidthBarePod(t, "bw-coexist", "198.18.44.0/24")
		if out, err := harness.Run("tc", "qdisc", "add", "dev", pod.host, "root", "handle", "7:", "htb"); err != nil {
			t.Fatalf("tc qdisc add htb: %v: %s", err, out)
		}
		conf := bandwidthConf(n.name, "1.0.0", map[string]any{"ingressRate": 10000000, "ingressBurst": 100000, "egressRate": 10000000, "egressBurst": 100000})
		_, err := bandwidthExec(t, h, "ADD", pod, conf)
		if err == nil || !strings.Contains(err.Error(), "htb") {
			t.Fatalf("ADD over a foreign root qdisc: got %v, want an error naming it", err)
		}
		out, _ := harness.Run("tc", "qdisc", "show", "dev", pod.host)
		if !strings.Contains(out, "htb 7:") {
			t.Fatalf("the foreign root qdisc is gone:\n%s", out)
		}
		if left := bandwidthIfbsOf(t, pod); len(left) != 0 {
			t.Fatalf("a failed ADD left ifb devices: %v", left)
		}
		if _, err := bandwidthExec(t, h, "DEL", pod, conf); err != nil {
			t.Fatalf("DEL: %v", err)
		}
		if out, _ := harness.Run("tc", "qdisc", "show", "dev", pod.host); !strings.Contains(out, "htb 7:") {
			t.Fatalf("DEL removed the foreign root qdisc:\n%s", out)
		}
	})
}

// TestBandwidthBadConfig: bad values are code 7 naming the field, and a
// refused ADD creates nothing.
func TestBandwidthBadConfig(t *testing.T) {
	h, n, pod := bandwidthBarePod(t, "bw-bad", "198.18.45.0/24")
	cases := []struct {
		name  string
		extra map[string]any
		field string
	}{
		{"rate without burst", map[string]any{"ingressRate": 1000000}, "ingressBurst"},
		{"burst without rate", map[string]any{"egressBurst": 1000000}, "egressRate"},
		{"zero rate with a burst", map[string]any{"egressRate": 0, "egressBurst": 1000000}, "egressRate"},
		{"negative rate", map[string]any{"ingressRate": -1, "ingressBurst": 1000}, "ingressRate"},
		{"fractional burst", map[string]any{"ingressRate": 1000, "ingressBurst": 1.5}, "ingressBurst"},
		{"rate below a byte", map[string]any{"egressRate": 7, "egressBurst": 1000}, "egressRate"},
		{"burst beyond 4 GiB", map[string]any{"egressRate": 1000000, "egressBurst": uint64(1) << 35}, "egressBurst"},
		{"not a number", map[string]any{"ingressRate": true, "ingressBurst": 1}, "ingressRate"},
		{"runtime config", map[string]any{"runtimeConfig": map[string]any{"bandwidth": map[string]any{"ingressRate": 1000000}}}, "runtimeConfig.bandwidth.ingressBurst"},
		{"runtime config negative", map[string]any{"runtimeConfig": map[string]any{"bandwidth": map[string]any{"egressRate": 1000000, "egressBurst": -8}}}, "runtimeConfig.bandwidth.egressBurst"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := bandwidthExec(t, h, "ADD", pod, bandwidthConf(n.name, "1.0.0", c.extra))
			assertCNIError(t, err, 7, c.field)
			if len(bandwidthIfbsOf(t, pod)) != 0 || bandwidthRootTbf(t, pod.host) != nil {
				t.Fatal("a refused ADD changed the host")
			}
			_, err = bandwidthExec(t, h, "CHECK", pod, bandwidthConf(n.name, "1.0.0", c.extra))
			assertCNIError(t, err, 7, c.field)
			// DEL undoes whatever ADD did, whatever the limits say.
			if _, err := bandwidthExec(t, h, "DEL", pod, bandwidthConf(n.name, "1.0.0", c.extra)); err != nil {
				t.Fatalf("DEL with a bad limit: %v", err)
			}
		})
	}
	t.Run("no prevResult", func(t *testing.T) {
		p := *pod
		p.res = nil
		_, err := bandwidthExec(t, h, "ADD", &p, bandwidthConf(n.name, "1.0.0", map[string]any{"ingressRate": 1000000, "ingressBurst": 100000}))
		assertCNIError(t, err, 7, "prevResult")
	})
}

// bandwidthDropVeth removes a host veth whose namespace was deleted, as
// the kernel does when the namespace goes. The namespace can outlive its
// mount point here: when the test process created it from its main OS
// thread, that thread stays in it (the Go runtime parks rather than ends a
// locked main thread), and so do its devices. When the namespace did go,
// the kernel removes the veth on its own, possibly between the lookup and
// the deletion here: gone is what is wanted either way.
func bandwidthDropVeth(t *testing.T, name string) {
	t.Helper()
	if l, err := netlink.LinkByName(name); err == nil {
		if err := netlink.LinkDel(l); err != nil && !link.IsNotFound(err) {
			t.Fatalf("delete %s: %v", name, err)
		}
	}
}

// TestBandwidthEveryVersion runs the life cycle after meshwire's veth for
// each spec version bandwidth serves, with STATUS and GC (through libcni)
// where the version has them.
func TestBandwidthEveryVersion(t *testing.T) {
	iface := bandwidthIfaces[2]
	for i, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			h := bandwidthHarness(t, iface)
			h.CheckNoLeaks()
			bw := `{"type":"bandwidth","ingressRate":20000000,"ingressBurst":200000,"egressRate":30000000,"egressBurst":300000}`
			n := newBandwidthNet(t, h, iface, v, "bw-v"+strings.ReplaceAll(v, ".", ""), fmt.Sprintf("198.18.%d.0/24", 36+i), bw)
			ns := h.NewNS("bw")
			a := h.Attach(n.shaped, ns, "eth0", nil)
			res, err := a.Add()
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if res.Version() != v {
				t.Fatalf("result version %s, want %s", res.Version(), v)
			}
			host := bandwidthHostEnd(t, ns)
			bandwidthWantTbf(t, host, 20_000_000)
			ifb := bandwidthIfbOf(t, host)
			bandwidthWantTbf(t, ifb, 30_000_000)
			if gte(v, "0.4.0") {
				if err := a.Check(); err != nil {
					t.Fatalf("CHECK: %v", err)
				}
			}
			if gte(v, "1.1.0") {
				if err := h.Status(n.shaped); err != nil {
					t.Fatalf("STATUS: %v", err)
				}
				if err := h.GC(n.shaped, a.GCAttachment()); err != nil {
					t.Fatalf("GC: %v", err)
				}
				if _, ok := bandwidthIfbs(t)[ifb]; !ok {
					t.Fatalf("GC removed %s of a valid attachment", ifb)
				}
			}
			if err := a.Del(); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if _, ok := bandwidthIfbs(t)[ifb]; ok {
				t.Fatalf("DEL left %s", ifb)
			}
			if err := a.Del(); err != nil {
				t.Fatalf("second DEL: %v", err)
			}
		})
	}
}

// TestBandwidthRepeatedAdd: a runtime retrying ADD for the same attachment
// gets the same shaping, not an error, and a changed config is applied.
func TestBandwidthRepeatedAdd(t *testing.T) {
	h, n, pod := bandwidthBarePod(t, "bw-again", "198.18.46.0/24")
	conf := bandwidthConf(n.name, "1.0.0", map[string]any{"ingressRate": 10000000, "ingressBurst": 100000, "egressRate": 10000000, "egressBurst": 100000})
	for i := 0; i < 2; i++ {
		if _, err := bandwidthExec(t, h, "ADD", pod, conf); err != nil {
			t.Fatalf("ADD #%d: %v", i+1, err)
		}
	}
	if ifbs := bandwidthIfbsOf(t, pod); len(ifbs) != 1 {
		t.Fatalf("ifbs after two ADDs: %v", ifbs)
	}
	if _, err := bandwidthExec(t, h, "CHECK", pod, conf); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	// The same attachment added again with other limits: the new ones apply
	// and the ingress qdisc stays recorded as meshwire's (DEL removes it).
	conf["egressRate"], conf["ingressRate"] = 20000000, 0
	delete(conf, "ingressBurst")
	if _, err := bandwidthExec(t, h, "ADD", pod, conf); err != nil {
		t.Fatalf("ADD with new limits: %v", err)
	}
	if bandwidthRootTbf(t, pod.host) != nil {
		t.Fatal("ingress still shaped after an ADD that does not limit it")
	}
	bandwidthWantTbf(t, bandwidthIfbOf(t, pod.host), 20000000)
	if _, err := bandwidthExec(t, h, "DEL", pod, conf); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if out, _ := harness.Run("tc", "qdisc", "show", "dev", pod.host, "ingress"); strings.Contains(out, "ingress") {
		t.Fatalf("DEL left the ingress qdisc ADD created:\n%s", out)
	}
}

// TestBandwidthDelAfterReference: a pod shaped by the reference plugin
// before meshwire replaced it loses its ifb at meshwire's DEL.
func TestBandwidthDelAfterReference(t *testing.T) {
	h, n, pod := bandwidthBarePod(t, "bw-upgrade", "198.18.45.0/24")
	conf := bandwidthConf(n.name, "1.0.0", map[string]any{"egressRate": 10000000, "egressBurst": 100000})
	ref := *h
	ref.BinDir = harness.ReferenceDir
	if _, err := bandwidthExec(t, &ref, "ADD", pod, conf); err != nil {
		t.Fatalf("reference ADD: %v", err)
	}
	ifb := bandwidthIfbOf(t, pod.host)
	if !strings.HasPrefix(ifb, "bwp") {
		t.Fatalf("the reference plugin made no ifb (redirect to %q)", ifb)
	}
	if _, err := bandwidthExec(t, h, "DEL", pod, conf); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if _, err := netlink.LinkByName(ifb); err == nil {
		t.Fatalf("meshwire's DEL left the reference plugin's %s", ifb)
	}
}

// TestBandwidthKilledBeforeAlias: an ADD killed between creating its ifb
// and labelling it (the alias) leaves an ifb named as the attachment's with
// no alias. The runtime's DEL removes it, and a repeated ADD takes it over;
// a device of that name that is not such an ifb is left alone.
func TestBandwidthKilledBeforeAlias(t *testing.T) {
	h := bandwidthHarness(t, bandwidthRefPtp)
	h.CheckNoLeaks()
	n := newBandwidthNet(t, h, bandwidthRefPtp, "1.0.0", "bw-kill", "198.18.53.0/24", `{"type":"bandwidth","egressRate":10000000,"egressBurst":100000}`)
	ns := h.NewNS("bw")
	a := h.Attach(n.shaped, ns, "eth0", nil)
	name := attachment.ID{Network: n.name, ContainerID: a.RT.ContainerID, IfName: "eth0"}.Ifb()
	halfMade := func() {
		t.Helper()
		if out, err := harness.Run("ip", "link", "add", name, "type", "ifb"); err != nil {
			t.Fatalf("ip link add %s type ifb: %v: %s", name, err, out)
		}
	}
	exists := func() bool { _, err := netlink.LinkByName(name); return err == nil }

	halfMade()
	if err := a.Del(); err != nil {
		t.Fatalf("DEL after the kill: %v", err)
	}
	if exists() {
		t.Fatalf("DEL left the unlabelled ifb %s", name)
	}

	halfMade()
	a.MustAdd()
	host := bandwidthHostEnd(t, ns)
	if got := bandwidthIfbOf(t, host); got != name {
		t.Fatalf("%s's ingress redirects to %q, want the ifb %s taken over", host, got, name)
	}
	if l, err := netlink.LinkByName(name); err != nil || l.Attrs().Alias == "" {
		t.Fatalf("the ifb taken over is not labelled: %v %+v", err, l)
	}
	if err := a.Del(); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if exists() {
		t.Fatalf("DEL left %s", name)
	}

	// Someone else's device of that name: ADD refuses, DEL leaves it.
	if out, err := harness.Run("ip", "link", "add", name, "type", "ifb"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	defer func() { _, _ = harness.Run("ip", "link", "del", name) }()
	if out, err := harness.Run("ip", "link", "set", name, "alias", "someone else's"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if _, err := a.Add(); err == nil || !strings.Contains(err.Error(), "not made by meshwire") {
		t.Fatalf("ADD over someone else's %s: %v", name, err)
	}
	if err := a.Del(); err != nil || !exists() {
		t.Fatalf("DEL with someone else's %s: %v (exists %v)", name, err, exists())
	}
}
