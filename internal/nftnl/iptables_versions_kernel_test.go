//go:build kernel

package nftnl

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/kerneltest"
)

// The rules the codec appends must be ordinary iptables-nft rules for every
// iptables-nft that may run on the node: `iptables-nft -S` and
// `iptables-nft-save` of that version print each one as the line it
// encodes. The system's iptables-nft is always tested (Debian 12's 1.8.9 on
// the build and CI machines: the only version Debian 12 ships); other
// builds are tested when MESHWIRE_IPTABLES_NFT lists their install
// prefixes (colon-separated, each holding sbin/iptables-nft and lib/), as
// testdata/build-iptables.sh makes them from the upstream sources Debian
// packages. Tested so: 1.8.9 (Debian 12) and 1.8.11 (Debian 13, built
// against Debian 12's libnftnl); the sources of older releases (1.8.7 of
// Debian 11 and Ubuntu 22.04) are not reachable from the build machines
// (their Debian pool files answer 404), and 1.8.10 is in no Debian suite.
// Both tested versions also write the same expressions as the codec.

// iptablesInstall is one iptables-nft: its tools' directory ("" for the
// system's, found on PATH) and the environment to run them with.
type iptablesInstall struct {
	name string
	dir  string
	env  []string
}

func iptablesInstalls(t *testing.T) []iptablesInstall {
	out := []iptablesInstall{{name: "system"}}
	for _, p := range filepath.SplitList(os.Getenv("MESHWIRE_IPTABLES_NFT")) {
		if p == "" {
			continue
		}
		if _, err := os.Stat(filepath.Join(p, "sbin", "iptables-nft")); err != nil {
			t.Fatalf("MESHWIRE_IPTABLES_NFT: %v", err)
		}
		out = append(out, iptablesInstall{
			name: filepath.Base(p),
			dir:  filepath.Join(p, "sbin"),
			env:  []string{"LD_LIBRARY_PATH=" + filepath.Join(p, "lib"), "XTABLES_LIBDIR=" + filepath.Join(p, "lib", "xtables")},
		})
	}
	return out
}

func (in iptablesInstall) run(stdin string, tool string, args ...string) (string, error) {
	if in.dir != "" {
		tool = filepath.Join(in.dir, tool)
	}
	return runEnv(in.env, stdin, tool, args...)
}

func (in iptablesInstall) tool(f Family, what string) string {
	base := "iptables-nft"
	if f == IP6 {
		base = "ip6tables-nft"
	}
	if what != "" {
		base += "-" + what
	}
	return base
}

// codecCase is one rule the codec encodes, and the line it stands for.
type codecCase struct {
	f        Family
	src, dst string
	notSrc   bool
}

func (c codecCase) line(comment string) string {
	s := "-A POSTROUTING"
	if c.notSrc {
		s += " !"
	}
	return s + fmt.Sprintf(" -s %s ! -d %s -m addrtype ! --dst-type MULTICAST -m comment --comment \"%s\" -j MASQUERADE", c.src, c.dst, comment)
}

func (c codecCase) exprs(comment string) ([]Expr, error) {
	_, src, err := net.ParseCIDR(c.src)
	if err != nil {
		return nil, err
	}
	_, dst, err := net.ParseCIDR(c.dst)
	if err != nil {
		return nil, err
	}
	cm, err := Comment(comment)
	if err != nil {
		return nil, err
	}
	exprs := append(AddrMatch(c.f, false, c.notSrc, *src), AddrMatch(c.f, true, true, *dst)...)
	return append(exprs, NotMulticastDst(), cm, Counter(), Masquerade(c.f)), nil
}

var codecCases = []codecCase{
	{f: IP, src: "198.18.16.5/32", dst: "198.18.16.0/24"},
	{f: IP, src: "198.18.16.5/32", dst: "198.18.0.0/15"},
	{f: IP, src: "198.18.16.5/32", dst: "198.18.16.4/30"},
	{f: IP, src: "198.18.16.0/20", dst: "198.18.0.0/16", notSrc: true},
	{f: IP, src: "198.18.16.5/32", dst: "0.0.0.0/1"},
	{f: IP6, src: "fd20::5/128", dst: "fd20::/64"},
	{f: IP6, src: "fd20::5/128", dst: "fd20::/60"},
	{f: IP6, src: "fd20::5/128", dst: "fd20:0:0:ab80::/57"},
	{f: IP6, src: "fd20:0:0:16::/64", dst: "fd00::/8", notSrc: true},
}

// TestCodecRulesReadByIPTablesVersions: rules appended over netlink read
// back, in `-S` and in `-save`, as the lines they encode, for each
// iptables-nft tested.
func TestCodecRulesReadByIPTablesVersions(t *testing.T) {
	kerneltest.Require(t)
	for _, in := range iptablesInstalls(t) {
		t.Run(in.name, func(t *testing.T) {
			version, err := in.run("", "iptables-nft", "--version")
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %s", in.name, strings.TrimSpace(version))
			inNewNS(t, func() error {
				for _, f := range []Family{IP, IP6} {
					// iptables-nft makes the nat table and its chains (with
					// a rule: it makes built-in chains when they are used).
					for _, op := range []string{"-A", "-D"} {
						if _, err := in.run("", in.tool(f, ""), "-t", "nat", op, "POSTROUTING", "-j", "ACCEPT"); err != nil {
							return err
						}
					}
				}
				c, err := Open()
				if err != nil {
					return err
				}
				defer c.Close()
				want := map[Family][]string{}
				for i, cc := range codecCases {
					comment := fmt.Sprintf("mw-test case %d", i)
					exprs, err := cc.exprs(comment)
					if err != nil {
						return err
					}
					if err := c.AppendRules([]NewRule{{Family: cc.f, Table: "nat", Chain: "POSTROUTING", Exprs: exprs}}); err != nil {
						return fmt.Errorf("case %d: %w", i, err)
					}
					want[cc.f] = append(want[cc.f], cc.line(comment))
				}
				for _, f := range []Family{IP, IP6} {
					listed, err := in.run("", in.tool(f, ""), "-t", "nat", "-S", "POSTROUTING")
					if err != nil {
						return err
					}
					if got, w := ruleLines(listed), strings.Join(want[f], "\n"); got != w {
						return fmt.Errorf("%s: %s -S prints\n%s\nwant\n%s", f, in.tool(f, ""), got, w)
					}
					saved, err := in.run("", in.tool(f, "save"), "-t", "nat")
					if err != nil {
						return err
					}
					if got, w := ruleLines(saved), strings.Join(want[f], "\n"); got != w {
						return fmt.Errorf("%s: %s prints\n%s\nwant\n%s", f, in.tool(f, "save"), got, w)
					}
				}
				// For the record: does this version write the same
				// expressions for the lines? (Reading ours alike is what
				// counts: a version may encode a line otherwise.)
				for i, cc := range codecCases {
					if _, err := in.run("*nat\n"+cc.line(fmt.Sprintf("mw-test case %d", i))+"\nCOMMIT\n", in.tool(cc.f, "restore"), "--noflush"); err != nil {
						return err
					}
				}
				for _, f := range []Family{IP, IP6} {
					raw, err := rawExprs(c, f, "nat", "POSTROUTING")
					if err != nil {
						return err
					}
					k := len(want[f])
					if len(raw) != 2*k {
						return fmt.Errorf("%s: %d rules, want %d", f, len(raw), 2*k)
					}
					for j := range k {
						if !bytes.Equal(raw[j], raw[k+j]) {
							t.Logf("%s: %s encodes %q otherwise than the codec", f, in.name, want[f][j])
						}
					}
				}
				return nil
			})
		})
	}
}

// ruleLines keeps the "-A" lines of iptables output.
func ruleLines(out string) string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "-A ") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}
