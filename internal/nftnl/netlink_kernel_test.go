//go:build kernel

package nftnl

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/kerneltest"
)

// inNewNS runs fn inside a throwaway network namespace.
func inNewNS(t *testing.T, fn func() error) {
	t.Helper()
	kerneltest.InNewNS(t, "fw", func(string, string) error { return fn() })
}

// chainRules reads the rules of a chain; a missing table or chain has none.
func chainRules(c *Conn, f Family, table, chain string) ([]rule, error) {
	var rules []rule
	err := c.Dump(unix.NFT_MSG_GETRULE, f, []Attr{StrAttr(unix.NFTA_RULE_TABLE, table), StrAttr(unix.NFTA_RULE_CHAIN, chain)},
		func() { rules = rules[:0] },
		func(obj []byte) { rules = append(rules, readRule(obj)) })
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	return rules, err
}

// ruleIDs names rules of one chain by handle.
func ruleIDs(f Family, table, chain string, handles ...uint64) []RuleID {
	ids := make([]RuleID, len(handles))
	for i, h := range handles {
		ids[i] = RuleID{Family: f, Table: table, Chain: chain, Handle: h}
	}
	return ids
}

// deleteTagged removes the rules of a chain whose comment sel accepts, in
// one transaction, as internal/firewall's DeleteMatching does.
func deleteTagged(c *Conn, f Family, table, chain string, sel func(comment string) bool) (int, error) {
	rules, err := chainRules(c, f, table, chain)
	if err != nil {
		return 0, err
	}
	var ids []RuleID
	for _, r := range rules {
		if sel(r.Comment) {
			ids = append(ids, RuleID{Family: f, Table: table, Chain: chain, Handle: r.Handle})
		}
	}
	return len(ids), c.DeleteRules(ids)
}

// iptablesNFT runs an iptables-nft tool of family f ("restore", "save", ""
// for iptables-nft itself).
func iptablesNFT(f Family, what, stdin string, args ...string) (string, error) {
	tool := "iptables-nft"
	if f == IP6 {
		tool = "ip6tables-nft"
	}
	if what != "" {
		tool += "-" + what
	}
	return run(stdin, tool, args...)
}

// restore applies an iptables-restore payload with iptables-nft.
func restore(f Family, payload string) error {
	_, err := iptablesNFT(f, "restore", payload, "--noflush")
	return err
}

func run(stdin, tool string, args ...string) (string, error) {
	return runEnv(nil, stdin, tool, args...)
}

// runEnv runs tool with stdin and env added to the environment, returning
// its output (its error output in the error).
func runEnv(env []string, stdin, tool string, args ...string) (string, error) {
	cmd := exec.Command(tool, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %v: %s", tool, strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

// TestTaggedRulesOverNetlink: rules written by iptables-nft are dumped
// with their handles, comments and targets, and removed by handle exactly
// as selected (none when one of them is gone), in both families; a missing
// table has no rules.
func TestTaggedRulesOverNetlink(t *testing.T) {
	kerneltest.Require(t)
	inNewNS(t, func() error {
		c, err := Open()
		if err != nil {
			return err
		}
		defer c.Close()
		for _, f := range []Family{IP, IP6} {
			rules, err := chainRules(c, f, "nat", "POSTROUTING")
			if err != nil || len(rules) != 0 {
				return fmt.Errorf("%s: missing table read as %v, %v; want no rules", f, rules, err)
			}
			src := map[Family]string{IP: "198.18.80.5/32", IP6: "fdf0:6d77::5/128"}[f]
			payload := "*nat\n" +
				"-A POSTROUTING -s " + src + " -m comment --comment \"mw-test A one\" -j MASQUERADE\n" +
				"-A POSTROUTING -m comment --comment \"somebody else\" -j ACCEPT\n" +
				"-A POSTROUTING -s " + src + " -m comment --comment \"mw-test A two\" -j MASQUERADE\n" +
				"COMMIT\n"
			if err := restore(f, payload); err != nil {
				return err
			}
			rules, err = chainRules(c, f, "nat", "POSTROUTING")
			if err != nil {
				return err
			}
			if len(rules) != 3 || rules[0].Comment != "mw-test A one" || rules[0].Target != "MASQUERADE" || rules[1].Comment != "somebody else" || rules[1].Target != "" {
				return fmt.Errorf("%s: rules read back %+v", f, rules)
			}
			// A handle already gone fails the whole transaction.
			if err := c.DeleteRules(ruleIDs(f, "nat", "POSTROUTING", rules[0].Handle, 1<<40)); err == nil {
				return fmt.Errorf("%s: deleting a missing handle succeeded", f)
			}
			n, err := deleteTagged(c, f, "nat", "POSTROUTING", func(c string) bool { return strings.HasPrefix(c, "mw-test A ") })
			if err != nil || n != 2 {
				return fmt.Errorf("%s: deleteTagged = %d, %v; want 2", f, n, err)
			}
			save, err := iptablesNFT(f, "save", "", "-t", "nat")
			if err != nil {
				return err
			}
			if strings.Contains(save, "mw-test") || !strings.Contains(save, "somebody else") {
				return fmt.Errorf("%s: after deleteTagged:\n%s", f, save)
			}
			if n, err := deleteTagged(c, f, "nat", "POSTROUTING", func(string) bool { return false }); err != nil || n != 0 {
				return fmt.Errorf("%s: deleteTagged of nothing = %d, %v", f, n, err)
			}
		}
		return nil
	})
}

// TestNftTablesOverNetlink: inet tables are listed and deleted, and deleting
// one that is not there is no error.
func TestNftTablesOverNetlink(t *testing.T) {
	kerneltest.Require(t)
	inNewNS(t, func() error {
		c, err := Open()
		if err != nil {
			return err
		}
		defer c.Close()
		if err := c.DeleteTables(Inet, []string{"mwt_absent"}); err != nil {
			return fmt.Errorf("deleting an absent table: %v", err)
		}
		if _, err := run("table ip mwt_n {\n\tchain c {\n\t\ttype nat hook postrouting priority srcnat;\n\t\tip saddr 198.18.80.5 masquerade comment \"native one\"\n\t}\n}\n", "nft", "-f", "-"); err != nil {
			return err
		}
		native, err := chainRules(c, IP, "mwt_n", "c")
		if err != nil || len(native) != 1 || native[0].Comment != "native one" || native[0].Target != "MASQUERADE" {
			return fmt.Errorf("native rule read back as %+v, %v", native, err)
		}
		if _, err := run("table inet mwt_a {\n\tchain c {\n\t\ttype nat hook postrouting priority srcnat;\n\t}\n}\ntable inet mwt_b {\n}\ntable ip mwt_c {\n}\n", "nft", "-f", "-"); err != nil {
			return err
		}
		names, err := c.Tables(Inet)
		if err != nil {
			return err
		}
		if strings.Join(names, ",") != "mwt_a,mwt_b" {
			return fmt.Errorf("inet tables %v, want [mwt_a mwt_b]", names)
		}
		if err := c.DeleteTables(Inet, []string{"mwt_a", "mwt_absent"}); err != nil {
			return err
		}
		out, err := run("", "nft", "list", "tables")
		if err != nil {
			return err
		}
		if strings.Contains(out, "mwt_a") || !strings.Contains(out, "mwt_b") || !strings.Contains(out, "mwt_c") {
			return fmt.Errorf("after deleting mwt_a:\n%s", out)
		}
		return nil
	})
}

// TestReleaseHandsOnlyRemovals: Release returns a duplicate of the socket
// only after a committed removal.
func TestReleaseHandsOnlyRemovals(t *testing.T) {
	kerneltest.Require(t)
	inNewNS(t, func() error {
		c, err := Open()
		if err != nil {
			return err
		}
		if _, err := c.Tables(Inet); err != nil {
			return err
		}
		if f := c.Release(); f != nil {
			f.Close()
			return fmt.Errorf("a read-only connection handed over its socket")
		}
		c, err = Open()
		if err != nil {
			return err
		}
		if err := c.DeleteTables(Inet, []string{"mwt_absent"}); err != nil {
			return err
		}
		f := c.Release()
		if f == nil {
			return fmt.Errorf("no socket handed over after a removal")
		}
		return f.Close()
	})
}

// taggedRules appends n masquerade rules tagged r0 … r<n-1> to the IPv4
// nat POSTROUTING chain with iptables-nft, sources in prefix (a /24's first
// three bytes).
func taggedRules(n int, prefix string) error {
	var payload strings.Builder
	payload.WriteString("*nat\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&payload, "-A POSTROUTING -s %s.%d/32 -m comment --comment \"r%d\" -j MASQUERADE\n", prefix, i%250+1, i)
	}
	payload.WriteString("COMMIT\n")
	return restore(IP, payload.String())
}

// TestChainRulesConsistentUnderChurn: a dump spans several reads, and rules
// removed ahead of the reader's position between two reads must not make it
// skip rules that stay; another connection removes rules from the front of
// the chain while this one reads it.
func TestChainRulesConsistentUnderChurn(t *testing.T) {
	kerneltest.Require(t)
	inNewNS(t, func() error {
		const n = 300
		if err := taggedRules(n, "198.18.81"); err != nil {
			return err
		}
		reader, err := Open()
		if err != nil {
			return err
		}
		defer reader.Close()
		writer, err := Open()
		if err != nil {
			return err
		}
		done := make(chan error, 1)
		go func() {
			defer writer.Close()
			for i := 0; i < n-1; i++ {
				tag := fmt.Sprintf("r%d", i)
				if _, err := deleteTagged(writer, IP, "nat", "POSTROUTING", func(c string) bool { return c == tag }); err != nil {
					done <- err
					return
				}
			}
			done <- nil
		}()
		for reads := 0; ; reads++ {
			select {
			case err := <-done:
				if reads == 0 {
					return fmt.Errorf("no read overlapped the removals")
				}
				return err
			default:
			}
			rules, err := chainRules(reader, IP, "nat", "POSTROUTING")
			if err != nil {
				return err
			}
			// The writer removes from the front, so any consistent read is
			// a contiguous run r<j> … r<n-1>; a skip shows as a gap.
			if len(rules) == 0 {
				return fmt.Errorf("read %d: no rules, want at least r%d", reads, n-1)
			}
			first := n - len(rules)
			for i, r := range rules {
				if want := fmt.Sprintf("r%d", first+i); r.Comment != want {
					return fmt.Errorf("read %d: rule %d of %d is %q, want %q (rules skipped or repeated)", reads, i, len(rules), r.Comment, want)
				}
			}
		}
	})
}

// rawExprs returns the expressions attribute of each rule of chain, as the
// kernel reports them.
func rawExprs(c *Conn, f Family, table, chain string) ([][]byte, error) {
	var out [][]byte
	err := c.Dump(unix.NFT_MSG_GETRULE, f, []Attr{StrAttr(unix.NFTA_RULE_TABLE, table), StrAttr(unix.NFTA_RULE_CHAIN, chain)},
		func() { out = out[:0] },
		func(obj []byte) {
			EachAttr(obj, func(typ uint16, d []byte) {
				if typ == unix.NFTA_RULE_EXPRESSIONS {
					out = append(out, append([]byte(nil), d...))
				}
			})
		})
	return out, err
}

// TestAppendedRulesAreIPTablesRules: a masquerade rule appended over netlink
// is, expression for expression, the rule iptables-nft-restore writes for
// the same line, and iptables-save prints the two alike; for byte-aligned
// and unaligned prefixes, in both families.
func TestAppendedRulesAreIPTablesRules(t *testing.T) {
	kerneltest.Require(t)
	cases := []struct {
		f        Family
		src, dst string
	}{
		{IP, "198.18.16.5/32", "198.18.16.0/24"},
		{IP, "198.18.16.5/32", "198.18.16.0/20"},
		{IP, "198.18.16.5/32", "198.18.0.0/16"},
		{IP, "198.18.16.5/32", "198.18.16.4/30"},
		{IP6, "fd20::5/128", "fd20::/64"},
		{IP6, "fd20::5/128", "fd20::/60"},
		{IP6, "fd20::5/128", "fd20:0:0:ab80::/57"},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprintf("%s-%s", tc.src, tc.dst), func(t *testing.T) {
			inNewNS(t, func() error {
				const comment = "mw-test rule"
				line := fmt.Sprintf("-A POSTROUTING -s %s ! -d %s -m addrtype ! --dst-type MULTICAST -m comment --comment \"%s\" -j MASQUERADE", tc.src, tc.dst, comment)
				if err := restore(tc.f, "*nat\n"+line+"\nCOMMIT\n"); err != nil {
					return err
				}
				_, src, _ := net.ParseCIDR(tc.src)
				_, dst, _ := net.ParseCIDR(tc.dst)
				cm, err := Comment(comment)
				if err != nil {
					return err
				}
				exprs := append(AddrMatch(tc.f, false, false, *src), AddrMatch(tc.f, true, true, *dst)...)
				exprs = append(exprs, NotMulticastDst(), cm, Counter(), Masquerade(tc.f))
				c, err := Open()
				if err != nil {
					return err
				}
				defer c.Close()
				if err := c.AppendRules([]NewRule{{Family: tc.f, Table: "nat", Chain: "POSTROUTING", Exprs: exprs}}); err != nil {
					return err
				}
				raw, err := rawExprs(c, tc.f, "nat", "POSTROUTING")
				if err != nil {
					return err
				}
				if len(raw) != 2 {
					return fmt.Errorf("%d rules in the chain, want the two", len(raw))
				}
				if !bytes.Equal(raw[0], raw[1]) {
					return fmt.Errorf("expressions differ:\niptables-nft %x\nnetlink      %x", raw[0], raw[1])
				}
				save, err := iptablesNFT(tc.f, "save", "", "-t", "nat")
				if err != nil {
					return err
				}
				if n := strings.Count(save, line+"\n"); n != 2 {
					return fmt.Errorf("iptables-save prints the line %d times, want 2:\n%s", n, save)
				}
				return nil
			})
		})
	}
}

// TestAppendToMissingChain: appending where iptables-nft has not made the
// table yet fails with ENOENT (the caller falls back to the tools).
func TestAppendToMissingChain(t *testing.T) {
	kerneltest.Require(t)
	inNewNS(t, func() error {
		c, err := Open()
		if err != nil {
			return err
		}
		defer c.Close()
		err = c.AppendRules([]NewRule{{Family: IP, Table: "nat", Chain: "POSTROUTING", Exprs: []Expr{Counter()}}})
		if !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("append to a missing table: %v, want ENOENT", err)
		}
		return nil
	})
}

// TestBatchOutcome: a transaction whose middle message fails is reported
// at once with the kernel's error and changes nothing (only the last
// message asks for an acknowledgement, every failure is reported anyway);
// an empty one is refused; a large one (more acknowledgements than the
// socket's buffer would hold) succeeds.
func TestBatchOutcome(t *testing.T) {
	kerneltest.Require(t)
	inNewNS(t, func() error {
		const n = 3000
		if err := taggedRules(n, "198.18.82"); err != nil {
			return err
		}
		c, err := Open()
		if err != nil {
			return err
		}
		defer c.Close()
		rules, err := chainRules(c, IP, "nat", "POSTROUTING")
		if err != nil || len(rules) != n {
			return fmt.Errorf("read %d rules, %v; want %d", len(rules), err, n)
		}
		start := time.Now()
		err = c.DeleteRules(ruleIDs(IP, "nat", "POSTROUTING", rules[0].Handle, 1<<40, rules[1].Handle))
		if !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("removal with a missing handle in the middle: %v, want ENOENT", err)
		}
		if d := time.Since(start); d > connTimeout/2 {
			return fmt.Errorf("the failure took %v to be reported", d)
		}
		if again, err := chainRules(c, IP, "nat", "POSTROUTING"); err != nil || len(again) != n {
			return fmt.Errorf("a failed transaction changed the chain: %d rules, %v", len(again), err)
		}
		if err := c.batch(func(b []byte) []byte { return b }); err == nil {
			return fmt.Errorf("an empty transaction was sent")
		}
		removed, err := deleteTagged(c, IP, "nat", "POSTROUTING", func(string) bool { return true })
		if err != nil || removed != n {
			return fmt.Errorf("removing %d rules in one transaction: %d removed, %v", n, removed, err)
		}
		if again, err := chainRules(c, IP, "nat", "POSTROUTING"); err != nil || len(again) != 0 {
			return fmt.Errorf("after removing all: %d rules, %v", len(again), err)
		}
		return nil
	})
}
