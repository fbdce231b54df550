package fwtext

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/meshwire/meshwire/internal/ruleset"
)

// Fuzz targets of the parsers that read the host's state as text or
// blobs: iptables text (legacy iptables' reads) and legacy iptables'
// table blob. Whatever the input, none may panic or report what is not
// in it. The seeds under testdata/fuzz are real: iptables-save output and
// rule lines of both variants and legacy nat blobs of both families, plus
// what fuzzing found.
//
//	go test -run '^$' -fuzz FuzzParseIPTablesRule -fuzztime 60s ./internal/firewall/fwtext/

// FuzzParseIPTablesRule: a rule line reads into a rule of the chain it
// names; when the typed fields hold the whole rule, the spec rendered from
// them reads back to the same rule (what a deletion by Rule.Ref and a caller's -D
// lines rely on).
func FuzzParseIPTablesRule(f *testing.F) {
	f.Add(`-A POSTROUTING -s 10.1.0.2/32 ! -d 10.1.0.0/24 -m comment --comment "name: \"x\" id: \"y\"" -j MASQUERADE`)
	f.Add(`-A MWT -p tcp -m tcp ! --dport 22 -m mark --mark 0x10/0x10 -g CNI-X`)
	f.Add(`-A OUTPUT`)
	f.Fuzz(func(t *testing.T, line string) {
		for _, fam := range []ruleset.IPVersion{ruleset.V4, ruleset.V6} {
			r, err := ParseIPTablesRule(fam, "nat", line)
			if err != nil {
				continue
			}
			args := SplitArgs(strings.TrimSpace(line))
			if r.Family != fam.Tables() || r.Table != "nat" || r.Chain == "" || !slices.Contains(args, r.Chain) {
				t.Fatalf("rule %+v of %q", r, line)
			}
			if r.Comment != "" && !slices.Contains(args, r.Comment) {
				t.Fatalf("comment %q is not in %q", r.Comment, line)
			}
			if r.Unknown != "" || strings.ContainsFunc(r.Chain, func(c rune) bool { return unicode.IsSpace(c) || c == '"' || c == '\\' }) {
				continue
			}
			typed := r
			typed.Spec = ""
			spec, ok := InstalledIPTablesSpec(typed)
			if !ok {
				continue
			}
			back, err := ParseIPTablesRule(fam, "nat", "-A "+r.Chain+" "+spec)
			if err != nil {
				t.Fatalf("%q rendered as %q, which does not read: %v", line, spec, err)
			}
			back.Spec = ""
			if back != typed {
				t.Fatalf("%q rendered as %q reads back differently:\n got %+v\nwant %+v", line, spec, back, typed)
			}
		}
	})
}

// FuzzParseIPTablesSave: any text reads into tables whose rules sit in the
// chain and table they are listed under, numbered in order.
func FuzzParseIPTablesSave(f *testing.F) {
	f.Add("*nat\n:PREROUTING ACCEPT [0:0]\n:CNI-X - [0:0]\n-A PREROUTING -j CNI-X\nCOMMIT\n")
	f.Add("-P OUTPUT ACCEPT\n-N X\n-A X -j RETURN\n")
	f.Fuzz(func(t *testing.T, save string) {
		for _, fam := range []ruleset.IPVersion{ruleset.V4, ruleset.V6} {
			for _, tb := range ParseIPTablesSave(fam, "nat", save) {
				if tb.Family != fam.Tables() {
					t.Fatalf("table %s of family %s", tb.Name, tb.Family)
				}
				for _, c := range tb.Chains {
					if c.Table != tb.Name || c.Family != tb.Family {
						t.Fatalf("chain %+v in table %s", c, tb.Name)
					}
					for i, r := range c.Rules {
						if r.Chain != c.Name || r.Table != tb.Name || r.Position != i+1 {
							t.Fatalf("rule %+v at %d of chain %s of %s", r, i+1, c.Name, tb.Name)
						}
					}
				}
			}
		}
	})
}

// FuzzErrorTargets: any bytes given as a legacy table blob either fail or
// give chain names taken from the blob.
func FuzzErrorTargets(f *testing.F) {
	// One user chain X and the final ERROR entry, as IPv4 lays them out.
	var blob []byte
	for _, name := range []string{"X", "ERROR"} {
		e := make([]byte, 88+4)
		binary.NativeEndian.PutUint16(e[88:], 112)    // target_offset
		binary.NativeEndian.PutUint16(e[90:], 112+64) // next_offset
		e = append(e, make([]byte, 20)...)
		tgt := make([]byte, 64)
		binary.NativeEndian.PutUint16(tgt, 64)
		copy(tgt[2:], "ERROR")
		copy(tgt[32:], name)
		blob = append(blob, append(e, tgt...)...)
	}
	f.Add(blob, false)
	f.Fuzz(func(t *testing.T, blob []byte, v6 bool) {
		off := 88
		if v6 {
			off = 140
		}
		names, err := ErrorTargets(nil, blob, off)
		if err != nil {
			return
		}
		for _, n := range names {
			if n == "" || n == "ERROR" || !bytes.Contains(blob, []byte(n)) {
				t.Fatalf("chain %q from the blob", n)
			}
		}
	})
}

// TestParseIPTablesRuleSpec: Spec is the text after the chain, however the
// chain is named or quoted.
func TestParseIPTablesRuleSpec(t *testing.T) {
	for line, want := range map[string]string{
		"-A A -j ACCEPT":                      "-j ACCEPT",
		`-A "X Y"   -s 10.0.0.1/32 -j RETURN`: "-s 10.0.0.1/32 -j RETURN",
		"  -A\tPOSTROUTING\t-j MASQUERADE  ":  "-j MASQUERADE",
		"-A OUTPUT":                           "",
	} {
		r, err := ParseIPTablesRule(ruleset.V4, "nat", line)
		if err != nil || r.Spec != want {
			t.Errorf("%q: spec %q, %v; want %q", line, r.Spec, err, want)
		}
	}
	for _, line := range []string{`-A ""`, "-A", "-N X"} {
		if _, err := ParseIPTablesRule(ruleset.V4, "nat", line); err == nil {
			t.Errorf("%q read as a rule", line)
		}
	}
}
