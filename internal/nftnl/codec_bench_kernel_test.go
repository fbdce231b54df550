//go:build kernel

package nftnl

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/google/nftables/xt"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/kerneltest"
	"github.com/meshwire/meshwire/internal/netns"
)

// This package (the codec) against github.com/google/nftables on what the
// plugins do with nf_tables:
//
//	add   one ADD's ipMasq rules (IPv4 + IPv6, as internal/ipmasq appends
//	      them): open, append both in one transaction, release, in a nat
//	      POSTROUTING that holds benchBackground other attachments;
//	del   one DEL: open, find the attachment's rules by comment in both
//	      families' chains, delete them by handle, release;
//	dump  read a chain holding 1,000 attachments' rules, on an open
//	      connection;
//	fresh one ADD, or one DEL, in a fresh process (the test binary run
//	      again), which is how a plugin meets the code: cold, once; timed
//	      inside the process and as the process's whole wall time.
//
// Both sides do the same thing with the same semantics (a generation-checked
// dump, the socket duplicated on release so that the RCU wait of the last
// close can go to a detached process, whose close is not timed here), and
// each iteration runs both, in alternating order. The rules each side writes
// are checked to be the rules iptables-nft-restore writes for the same line
// (expression for expression) and to print alike in `iptables-nft -S`.
//
//	go test -run '^$' -bench CodecVsLibrary -benchtime 200x ./internal/nftnl/
//
// Reported per side: ns/op (mean), p50-ns, B/op, allocs/op, and lib/codec,
// the ratio of the means.
//
// The decision rule and the figures measured are in the package doc
// (doc.go); the fresh-add process wall time then was codec 8.3-8.5 ms,
// library 8.9-9.8 ms.
//
// The library's ruleset generation is asked on the library's own socket.
// Conn.Release's duplicate socket is not a difference: the library's socket
// is reachable (WithSockOptions, SyscallConn), as libConn.release shows.
//
// Both sides read the same of each rule (rule: handle, comment, target),
// the codec through Dump and its attribute parsers (readRule), the library
// through GetRules (libRule); the plugins' typed reads (internal/firewall's
// decoder) sit on Dump the same way.

const benchBackground = 100

func BenchmarkCodecVsLibrary(b *testing.B) {
	kerneltest.Require(b)
	b.Run("add", func(b *testing.B) { benchInNS(b, benchAdd) })
	b.Run("del", func(b *testing.B) { benchInNS(b, benchDel) })
	b.Run("dump1000", func(b *testing.B) { benchInNS(b, benchDump) })
	b.Run("fresh-add", func(b *testing.B) { benchInNS(b, benchFresh("add")) })
	b.Run("fresh-del", func(b *testing.B) { benchInNS(b, benchFresh("del")) })
}

// benchInNS runs fn in a throwaway network namespace that it removes.
func benchInNS(b *testing.B, fn func(b *testing.B, nsPath string) error) {
	kerneltest.InNewNS(b, "codec-bench", func(_, p string) error { return fn(b, p) })
}

// side is one implementation's figures.
type side struct {
	ns            []time.Duration
	bytes, allocs uint64
}

func (s *side) measure(fn func() error) error {
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	t := time.Now()
	err := fn()
	d := time.Since(t)
	runtime.ReadMemStats(&m1)
	s.add(d, m1.TotalAlloc-m0.TotalAlloc, m1.Mallocs-m0.Mallocs)
	return err
}

func (s *side) add(d time.Duration, bytes, allocs uint64) {
	s.ns = append(s.ns, d)
	s.bytes += bytes
	s.allocs += allocs
}

func (s *side) mean() float64 {
	var sum time.Duration
	for _, d := range s.ns {
		sum += d
	}
	return float64(sum) / float64(len(s.ns))
}

func report(b *testing.B, codec, lib *side) {
	for _, x := range []struct {
		name string
		s    *side
	}{{"codec", codec}, {"lib", lib}} {
		n := float64(len(x.s.ns))
		sorted := slices.Clone(x.s.ns)
		slices.Sort(sorted)
		b.ReportMetric(x.s.mean(), x.name+"-ns/op")
		b.ReportMetric(float64(sorted[len(sorted)/2]), x.name+"-p50-ns")
		b.ReportMetric(float64(x.s.bytes)/n, x.name+"-B/op")
		b.ReportMetric(float64(x.s.allocs)/n, x.name+"-allocs/op")
	}
	b.ReportMetric(lib.mean()/codec.mean(), "lib/codec")
	b.ReportMetric(0, "ns/op") // an iteration runs both sides
}

// both runs codec and lib in the order of iteration i: codec first on even
// iterations, the library first on odd ones.
func both(i int, codec, lib func() error) error {
	first, second := codec, lib
	if i%2 == 1 {
		first, second = lib, codec
	}
	if err := first(); err != nil {
		return err
	}
	return second()
}

// A pod of the benchmark: its tag, comment and addresses.
type benchPod struct {
	tag, comment string
	v4, v6       net.IPNet // with the subnet's mask
}

func podOf(i int) benchPod {
	tag := fmt.Sprintf("MW-6d657368-%015x", i)
	return benchPod{
		tag:     tag,
		comment: "meshwire-masq " + tag + " net=bench id=" + fmt.Sprintf("%024x", i) + " if=eth0",
		v4:      net.IPNet{IP: net.IPv4(198, 18, byte(i>>8), byte(i)).To4(), Mask: net.CIDRMask(15, 32)},
		v6:      net.IPNet{IP: net.ParseIP(fmt.Sprintf("fd20::%x", i+1)), Mask: net.CIDRMask(64, 128)},
	}
}

// line is the iptables-save line of the pod's rule in family f.
func (p benchPod) line(f Family) string {
	a, host := p.v4, "/32"
	if f == IP6 {
		a, host = p.v6, "/128"
	}
	sub := net.IPNet{IP: a.IP.Mask(a.Mask), Mask: a.Mask}
	return fmt.Sprintf("-A POSTROUTING -s %s%s ! -d %s -m addrtype ! --dst-type MULTICAST -m comment --comment \"%s\" -j MASQUERADE", a.IP, host, sub.String(), p.comment)
}

func (p benchPod) addr(f Family) net.IPNet {
	if f == IP6 {
		return p.v6
	}
	return p.v4
}

func hostNet(f Family, ip net.IP) net.IPNet {
	if f == IP6 {
		return net.IPNet{IP: ip.To16(), Mask: net.CIDRMask(128, 128)}
	}
	return net.IPNet{IP: ip.To4(), Mask: net.CIDRMask(32, 32)}
}

func subnetOf(a net.IPNet) net.IPNet { return net.IPNet{IP: a.IP.Mask(a.Mask), Mask: a.Mask} }

// codecAdd is internal/ipmasq's appendRules: the caller closes the file.
func codecAdd(p benchPod) (*os.File, error) {
	cm, err := Comment(p.comment)
	if err != nil {
		return nil, err
	}
	var rules []NewRule
	for _, f := range []Family{IP, IP6} {
		a := p.addr(f)
		exprs := append(AddrMatch(f, false, false, hostNet(f, a.IP)), AddrMatch(f, true, true, subnetOf(a))...)
		exprs = append(exprs, NotMulticastDst(), cm, Counter(), Masquerade(f))
		rules = append(rules, NewRule{Family: f, Table: "nat", Chain: "POSTROUTING", Exprs: exprs})
	}
	c, err := Open()
	if err != nil {
		return nil, err
	}
	err = c.AppendRules(rules)
	tail := c.Release()
	if err != nil && tail != nil {
		tail.Close()
		tail = nil
	}
	return tail, err
}

// codecDel is internal/ipmasq's Teardown on iptables-nft.
func codecDel(p benchPod) (*os.File, error) {
	c, err := Open()
	if err != nil {
		return nil, err
	}
	for _, f := range []Family{IP, IP6} {
		if _, err = deleteTagged(c, f, "nat", "POSTROUTING", func(cm string) bool { return cm == p.comment }); err != nil {
			break
		}
	}
	tail := c.Release()
	if err != nil && tail != nil {
		tail.Close()
		tail = nil
	}
	return tail, err
}

// libConn is a connection through github.com/google/nftables with the
// codec's semantics: one socket for the connection's life (AsLasting), the
// socket reachable for the generation check and the duplicate on release.
type libConn struct {
	c         *nftables.Conn
	nl        *netlink.Conn
	committed bool
}

func libOpen() (*libConn, error) {
	lc := &libConn{}
	c, err := nftables.New(nftables.AsLasting(), nftables.WithSockOptions(func(nl *netlink.Conn) error {
		lc.nl = nl
		return nil
	}))
	if err != nil {
		return nil, err
	}
	lc.c = c
	return lc, nil
}

func (lc *libConn) release() *os.File {
	var dup *os.File
	if lc.committed {
		if rc, err := lc.nl.SyscallConn(); err == nil {
			_ = rc.Control(func(fd uintptr) {
				if nfd, err := unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0); err == nil {
					dup = os.NewFile(uintptr(nfd), "nf_tables")
				}
			})
		}
	}
	_ = lc.c.CloseLasting()
	return dup
}

// generation: the library has no call for it (v0.3.0), so it is asked on
// the library's own socket.
func (lc *libConn) generation() (uint32, error) {
	msgs, err := lc.nl.Execute(netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
		Data:   []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0},
	})
	if err != nil {
		return 0, err
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, err
		}
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				return binaryBE32(ad.Bytes()), nil
			}
		}
	}
	return 0, errors.New("no generation in the answer")
}

func binaryBE32(b []byte) uint32 {
	if len(b) != 4 {
		return 0
	}
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

func libFamily(f Family) nftables.TableFamily {
	if f == IP6 {
		return nftables.TableFamilyIPv6
	}
	return nftables.TableFamilyIPv4
}

// chainRules is chainRules through the library, generation-checked.
func (lc *libConn) chainRules(f Family, table, chain string) ([]rule, error) {
	t := &nftables.Table{Name: table, Family: libFamily(f)}
	c := &nftables.Chain{Name: chain, Table: t}
	for attempt := 0; attempt < 100; attempt++ {
		before, err := lc.generation()
		if err != nil {
			return nil, err
		}
		rs, err := lc.c.GetRules(t, c)
		if err != nil {
			// The library formats the kernel's error with %v: only its
			// text tells a missing chain.
			if strings.Contains(err.Error(), unix.ENOENT.Error()) {
				return nil, nil
			}
			return nil, err
		}
		after, err := lc.generation()
		if err != nil {
			return nil, err
		}
		if before != after {
			continue
		}
		out := make([]rule, 0, len(rs))
		for _, r := range rs {
			out = append(out, libRule(r))
		}
		return out, nil
	}
	return nil, errors.New("the ruleset kept changing")
}

func libRule(r *nftables.Rule) rule {
	out := rule{Handle: r.Handle}
	if c, ok := userdata.GetString(r.UserData, userdata.TypeComment); ok {
		out.Comment = c
	}
	for _, e := range r.Exprs {
		switch e := e.(type) {
		case *expr.Masq:
			out.Target = "MASQUERADE"
		case *expr.Target:
			out.Target = e.Name
		case *expr.Match:
			if c, ok := e.Info.(*xt.Comment); ok && e.Name == "comment" {
				out.Comment = string(*c)
			}
		}
	}
	return out
}

func (lc *libConn) deleteTagged(f Family, table, chain string, sel func(string) bool) (int, error) {
	rules, err := lc.chainRules(f, table, chain)
	if err != nil {
		return 0, err
	}
	t := &nftables.Table{Name: table, Family: libFamily(f)}
	c := &nftables.Chain{Name: chain, Table: t}
	n := 0
	for _, r := range rules {
		if sel(r.Comment) {
			if err := lc.c.DelRule(&nftables.Rule{Table: t, Chain: c, Handle: r.Handle}); err != nil {
				return 0, err
			}
			n++
		}
	}
	if n == 0 {
		return 0, nil
	}
	if err := lc.c.Flush(); err != nil {
		return 0, err
	}
	lc.committed = true
	return n, nil
}

// libAddrMatch is AddrMatch in the library's expressions.
func libAddrMatch(f Family, dst, invert bool, n net.IPNet) []expr.Any {
	offset, mask, value := addrLoad(f, dst, n)
	length := len(value)
	op := expr.CmpOpEq
	if invert {
		op = expr.CmpOpNeq
	}
	exprs := []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: uint32(length)}}
	if mask != nil {
		exprs = append(exprs, &expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: uint32(length), Mask: mask, Xor: make([]byte, length)})
	}
	return append(exprs, &expr.Cmp{Op: op, Register: 1, Data: value})
}

func libMasquerade(f Family) expr.Any {
	if f == IP6 {
		info := xt.Unknown(make([]byte, 40))
		return &expr.Target{Name: "MASQUERADE", Info: &info}
	}
	return &expr.Target{Name: "MASQUERADE", Info: &xt.NatIPv4MultiRangeCompat{{}}}
}

func libAdd(p benchPod) (*os.File, error) {
	lc, err := libOpen()
	if err != nil {
		return nil, err
	}
	for _, f := range []Family{IP, IP6} {
		a := p.addr(f)
		cm := xt.Comment(p.comment)
		exprs := append(libAddrMatch(f, false, false, hostNet(f, a.IP)), libAddrMatch(f, true, true, subnetOf(a))...)
		exprs = append(exprs,
			&expr.Match{Name: "addrtype", Rev: 1, Info: &xt.AddrTypeV1{Dest: 1 << unix.RTN_MULTICAST, Flags: 0x2}},
			&expr.Match{Name: "comment", Info: &cm},
			&expr.Counter{},
			libMasquerade(f))
		t := &nftables.Table{Name: "nat", Family: libFamily(f)}
		lc.c.AddRule(&nftables.Rule{Table: t, Chain: &nftables.Chain{Name: "POSTROUTING", Table: t}, Exprs: exprs})
	}
	err = lc.c.Flush()
	if err == nil {
		lc.committed = true
	}
	tail := lc.release()
	if err != nil && tail != nil {
		tail.Close()
		tail = nil
	}
	return tail, err
}

func libDel(p benchPod) (*os.File, error) {
	lc, err := libOpen()
	if err != nil {
		return nil, err
	}
	for _, f := range []Family{IP, IP6} {
		if _, err = lc.deleteTagged(f, "nat", "POSTROUTING", func(cm string) bool { return cm == p.comment }); err != nil {
			break
		}
	}
	tail := lc.release()
	if err != nil && tail != nil {
		tail.Close()
		tail = nil
	}
	return tail, err
}

// closeTail closes the duplicate socket, as the detached process would:
// untimed.
func closeTail(f *os.File, err error) error {
	if f != nil {
		f.Close()
	}
	return err
}

// background writes n attachments' rules (one per family each) with
// iptables-nft-restore, pods base … base+n-1.
func background(base, n int) error {
	for _, f := range []Family{IP, IP6} {
		var payload strings.Builder
		payload.WriteString("*nat\n")
		for i := base; i < base+n; i++ {
			payload.WriteString(podOf(i).line(f) + "\n")
		}
		payload.WriteString("COMMIT\n")
		if err := restore(f, payload.String()); err != nil {
			return err
		}
	}
	return nil
}

// podRules counts the rules of p in both families (read by the codec) and
// checks they are masquerade rules.
func podRules(p benchPod) (n int, total int, err error) {
	c, err := Open()
	if err != nil {
		return 0, 0, err
	}
	defer c.Close()
	for _, f := range []Family{IP, IP6} {
		rules, err := chainRules(c, f, "nat", "POSTROUTING")
		if err != nil {
			return 0, 0, err
		}
		total += len(rules)
		for _, r := range rules {
			if r.Comment == p.comment {
				if r.Target != "MASQUERADE" {
					return 0, 0, fmt.Errorf("rule %+v is not a masquerade", r)
				}
				n++
			}
		}
	}
	return n, total, nil
}

// checkSameRules: the pod's rules written by the codec, by the library and
// by iptables-nft-restore are the same expressions, and `iptables-nft -S`
// prints each as the line written.
func checkSameRules(p benchPod) error {
	var raw [3][2][]byte
	var listed [3][2]string
	for k, write := range []func() error{
		func() error { return closeTail(codecAdd(p)) },
		func() error { return closeTail(libAdd(p)) },
		func() error {
			for _, f := range []Family{IP, IP6} {
				if err := restore(f, "*nat\n"+p.line(f)+"\nCOMMIT\n"); err != nil {
					return err
				}
			}
			return nil
		},
	} {
		if err := write(); err != nil {
			return fmt.Errorf("writer %d: %w", k, err)
		}
		c, err := Open()
		if err != nil {
			return err
		}
		for j, f := range []Family{IP, IP6} {
			exprs, err := rawExprs(c, f, "nat", "POSTROUTING")
			if err != nil {
				c.Close()
				return err
			}
			raw[k][j] = exprs[len(exprs)-1]
			out, err := iptablesNFT(f, "", "", "-t", "nat", "-S", "POSTROUTING")
			if err != nil {
				c.Close()
				return err
			}
			for _, l := range strings.Split(out, "\n") {
				if strings.Contains(l, p.tag) {
					listed[k][j] += l + "\n"
				}
			}
			if listed[k][j] != p.line(f)+"\n" {
				c.Close()
				return fmt.Errorf("writer %d, %s: iptables-nft -S prints\n%s, want\n%s", k, f, listed[k][j], p.line(f))
			}
		}
		_, err = deleteTagged(c, IP, "nat", "POSTROUTING", func(cm string) bool { return cm == p.comment })
		if err == nil {
			_, err = deleteTagged(c, IP6, "nat", "POSTROUTING", func(cm string) bool { return cm == p.comment })
		}
		c.Close()
		if err != nil {
			return err
		}
	}
	for j := range 2 {
		if !bytes.Equal(raw[0][j], raw[2][j]) || !bytes.Equal(raw[1][j], raw[2][j]) {
			return fmt.Errorf("family %d: expressions differ:\ncodec        %x\nlibrary      %x\niptables-nft %x", j, raw[0][j], raw[1][j], raw[2][j])
		}
	}
	return nil
}

func benchAdd(b *testing.B, _ string) error {
	if err := background(0, benchBackground); err != nil {
		return err
	}
	if err := checkSameRules(podOf(benchBackground)); err != nil {
		return err
	}
	var codec, lib side
	for i := 0; i < b.N; i++ {
		p := podOf(benchBackground + 1 + i)
		run := func(s *side, add func(benchPod) (*os.File, error)) func() error {
			return func() error {
				var tail *os.File
				err := s.measure(func() error {
					var err error
					tail, err = add(p)
					return err
				})
				if err := closeTail(tail, err); err != nil {
					return err
				}
				if n, total, err := podRules(p); err != nil || n != 2 || total != 2*benchBackground+2 {
					return fmt.Errorf("after ADD: %d of the pod's rules, %d in all, %v", n, total, err)
				}
				return closeTail(codecDel(p))
			}
		}
		if err := both(i, run(&codec, codecAdd), run(&lib, libAdd)); err != nil {
			return err
		}
	}
	report(b, &codec, &lib)
	return nil
}

func benchDel(b *testing.B, _ string) error {
	if err := background(0, benchBackground); err != nil {
		return err
	}
	var codec, lib side
	for i := 0; i < b.N; i++ {
		p := podOf(benchBackground + 1 + i)
		run := func(s *side, del func(benchPod) (*os.File, error)) func() error {
			return func() error {
				if err := closeTail(codecAdd(p)); err != nil {
					return err
				}
				var tail *os.File
				err := s.measure(func() error {
					var err error
					tail, err = del(p)
					return err
				})
				if err := closeTail(tail, err); err != nil {
					return err
				}
				if n, total, err := podRules(p); err != nil || n != 0 || total != 2*benchBackground {
					return fmt.Errorf("after DEL: %d of the pod's rules, %d in all, %v", n, total, err)
				}
				return nil
			}
		}
		if err := both(i, run(&codec, codecDel), run(&lib, libDel)); err != nil {
			return err
		}
	}
	report(b, &codec, &lib)
	return nil
}

func benchDump(b *testing.B, _ string) error {
	const n = 1000
	if err := background(0, n); err != nil {
		return err
	}
	c, err := Open()
	if err != nil {
		return err
	}
	defer c.Close()
	lc, err := libOpen()
	if err != nil {
		return err
	}
	defer lc.release()
	check := func(rules []rule) error {
		if len(rules) != n {
			return fmt.Errorf("read %d rules, want %d", len(rules), n)
		}
		for i, r := range rules {
			if r.Comment != podOf(i).comment || r.Target != "MASQUERADE" || r.Handle == 0 {
				return fmt.Errorf("rule %d read as %+v", i, r)
			}
		}
		return nil
	}
	var codec, lib side
	for i := 0; i < b.N; i++ {
		var rc, rl []rule
		err := both(i,
			func() error {
				return codec.measure(func() (err error) { rc, err = chainRules(c, IP, "nat", "POSTROUTING"); return err })
			},
			func() error {
				return lib.measure(func() (err error) { rl, err = lc.chainRules(IP, "nat", "POSTROUTING"); return err })
			})
		if err != nil {
			return err
		}
		if err := check(rc); err != nil {
			return fmt.Errorf("codec: %w", err)
		}
		if err := check(rl); err != nil {
			return fmt.Errorf("library: %w", err)
		}
		for j := range rc {
			if rc[j].Handle != rl[j].Handle || rc[j].Comment != rl[j].Comment || rc[j].Target != rl[j].Target {
				return fmt.Errorf("rule %d: the codec read %+v, the library %+v", j, rc[j], rl[j])
			}
		}
	}
	report(b, &codec, &lib)
	return nil
}

// benchFresh: each ADD (op "add") or DEL ("del") runs in a new process
// (this test binary, running TestCodecBenchChild), timed inside the child
// around open, the change and release (cold: first use of the code), and
// outside as the process's wall time. A DEL's rules are appended first by
// the parent (with the codec).
func benchFresh(op string) func(b *testing.B, nsPath string) error {
	return func(b *testing.B, nsPath string) error {
		if err := background(0, benchBackground); err != nil {
			return err
		}
		var codec, lib, codecWall, libWall side
		for i := 0; i < b.N; i++ {
			p := podOf(benchBackground + 1 + i)
			run := func(s, wall *side, which string) func() error {
				return func() error {
					if op == "del" {
						if err := closeTail(codecAdd(p)); err != nil {
							return err
						}
					}
					cmd := exec.Command(os.Args[0], "-test.run=^TestCodecBenchChild$", "-test.count=1")
					cmd.Env = append(os.Environ(), "MW_CODEC_BENCH_CHILD="+which, "MW_CODEC_BENCH_OP="+op,
						"MW_CODEC_BENCH_NS="+nsPath, "MW_CODEC_BENCH_POD="+strconv.Itoa(benchBackground+1+i))
					var out, errb bytes.Buffer
					cmd.Stdout, cmd.Stderr = &out, &errb
					t := time.Now()
					err := cmd.Run()
					wall.add(time.Since(t), 0, 0)
					if err != nil {
						return fmt.Errorf("child %s: %v: %s%s", which, err, out.String(), errb.String())
					}
					var ns, bytes, allocs uint64
					if _, err := fmt.Sscanf(lastLine(out.String(), "CHILD "), "CHILD %d %d %d", &ns, &bytes, &allocs); err != nil {
						return fmt.Errorf("child %s said %q: %v", which, out.String(), err)
					}
					s.add(time.Duration(ns), bytes, allocs)
					n, _, err := podRules(p)
					if op == "del" {
						if err != nil || n != 0 {
							return fmt.Errorf("after a fresh DEL: %d of the pod's rules, %v", n, err)
						}
						return nil
					}
					if err != nil || n != 2 {
						return fmt.Errorf("after a fresh ADD: %d of the pod's rules, %v", n, err)
					}
					return closeTail(codecDel(p))
				}
			}
			if err := both(i, run(&codec, &codecWall, "codec"), run(&lib, &libWall, "lib")); err != nil {
				return err
			}
		}
		report(b, &codec, &lib)
		b.ReportMetric(codecWall.mean(), "codec-process-ns/op")
		b.ReportMetric(libWall.mean(), "lib-process-ns/op")
		return nil
	}
}

func lastLine(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// TestCodecBenchChild is the fresh process of BenchmarkCodecVsLibrary's
// fresh-add; without its environment it does nothing.
func TestCodecBenchChild(t *testing.T) {
	// No kerneltest.Require: the benchmark that starts this process holds
	// the node lock.
	which := os.Getenv("MW_CODEC_BENCH_CHILD")
	if which == "" {
		return
	}
	i, err := strconv.Atoi(os.Getenv("MW_CODEC_BENCH_POD"))
	if err != nil {
		t.Fatal(err)
	}
	change := map[string]func(benchPod) (*os.File, error){"codec add": codecAdd, "lib add": libAdd, "codec del": codecDel, "lib del": libDel}[which+" "+os.Getenv("MW_CODEC_BENCH_OP")]
	if change == nil {
		t.Fatalf("MW_CODEC_BENCH_CHILD %q, MW_CODEC_BENCH_OP %q", which, os.Getenv("MW_CODEC_BENCH_OP"))
	}
	var s side
	err = netns.Enter(os.Getenv("MW_CODEC_BENCH_NS"), func() error {
		var tail *os.File
		err := s.measure(func() (err error) { tail, err = change(podOf(i)); return err })
		return closeTail(tail, err)
	})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("CHILD %d %d %d\n", s.ns[0], s.bytes, s.allocs)
}
