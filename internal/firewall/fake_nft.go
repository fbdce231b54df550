package firewall

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The Fake's reading of nft scripts: the commands meshwire writes (add,
// create, delete, destroy, flush of tables, chains and rules; table blocks
// with comments and chains; chain blocks with a hook, a policy, a comment
// and rules), with rule statements read into the typed fields.

type nftTok struct {
	s      string
	quoted bool
}

func (t nftTok) text() string {
	if t.quoted {
		return strconv.Quote(t.s)
	}
	return t.s
}

func nftTokens(script string) ([]nftTok, error) {
	var out []nftTok
	for i := 0; i < len(script); {
		c := script[i]
		switch {
		case c == '#':
			for i < len(script) && script[i] != '\n' {
				i++
			}
		case c == ' ' || c == '\t' || c == '\r':
			i++
		case c == '\n' || c == ';' || c == '{' || c == '}':
			out = append(out, nftTok{s: string(c)})
			i++
		case c == '"':
			j := i + 1
			var b strings.Builder
			for j < len(script) && script[j] != '"' {
				if script[j] == '\\' && j+1 < len(script) {
					j++
				}
				b.WriteByte(script[j])
				j++
			}
			if j >= len(script) {
				return nil, fmt.Errorf("nft: unterminated string")
			}
			out = append(out, nftTok{s: b.String(), quoted: true})
			i = j + 1
		default:
			j := i
			for j < len(script) && !strings.ContainsRune(" \t\r\n;{}\"", rune(script[j])) {
				j++
			}
			out = append(out, nftTok{s: script[i:j]})
			i = j
		}
	}
	return out, nil
}

// nftStmt is one statement: its words and, when it has one, its block.
type nftStmt struct {
	words []nftTok
	block []nftStmt
	hasB  bool
}

// parseStmts reads statements until a closing brace (nested) or the end.
func parseStmts(toks []nftTok, i int, nested bool) ([]nftStmt, int, error) {
	var out []nftStmt
	var cur nftStmt
	flush := func() {
		if len(cur.words) > 0 || cur.hasB {
			out = append(out, cur)
		}
		cur = nftStmt{}
	}
	for i < len(toks) {
		t := toks[i]
		switch {
		case !t.quoted && (t.s == "\n" || t.s == ";"):
			flush()
			i++
		case !t.quoted && t.s == "{":
			block, j, err := parseStmts(toks, i+1, true)
			if err != nil {
				return nil, 0, err
			}
			cur.block, cur.hasB = block, true
			flush()
			i = j
		case !t.quoted && t.s == "}":
			if !nested {
				return nil, 0, fmt.Errorf("nft: unexpected }")
			}
			flush()
			return out, i + 1, nil
		default:
			cur.words = append(cur.words, t)
			i++
		}
	}
	if nested {
		return nil, 0, fmt.Errorf("nft: missing }")
	}
	flush()
	return out, i, nil
}

func applyNftScript(state map[tableKey]*fakeTable, script string) error {
	toks, err := nftTokens(script)
	if err != nil {
		return err
	}
	stmts, _, err := parseStmts(toks, 0, false)
	if err != nil {
		return err
	}
	for _, st := range stmts {
		if err := applyNftStmt(state, st); err != nil {
			return fmt.Errorf("nft: %s: %w", stmtText(st), err)
		}
	}
	return nil
}

func stmtText(st nftStmt) string {
	w := make([]string, len(st.words))
	for i, t := range st.words {
		w[i] = t.text()
	}
	return strings.Join(w, " ")
}

func applyNftStmt(state map[tableKey]*fakeTable, st nftStmt) error {
	w := st.words
	if len(w) == 0 {
		return fmt.Errorf("empty statement")
	}
	verb := "add"
	switch w[0].s {
	case "add", "create", "delete", "destroy", "flush", "insert":
		verb, w = w[0].s, w[1:]
	}
	if len(w) < 3 {
		return fmt.Errorf("too short")
	}
	obj := w[0].s
	fam, err := ParseTableFamily(w[1].s)
	if err != nil {
		return err
	}
	k := tableKey{fam, w[2].s}
	t := state[k]
	switch obj {
	case "table":
		switch verb {
		case "add", "create":
			if t != nil && verb == "create" {
				return fmt.Errorf("table exists: %w", unix.EEXIST)
			}
			if t == nil {
				t = &fakeTable{}
				state[k] = t
			}
			return applyTableBlock(t, fam, k.name, st.block)
		case "delete", "destroy":
			if t == nil && verb == "delete" {
				return fmt.Errorf("no such table: %w", unix.ENOENT)
			}
			delete(state, k)
		case "flush":
			if t == nil {
				return fmt.Errorf("no such table: %w", unix.ENOENT)
			}
			for _, c := range t.chains {
				c.Rules = nil
			}
		default:
			return fmt.Errorf("%s table is not supported", verb)
		}
		return nil
	case "chain", "rule":
	default:
		return fmt.Errorf("unsupported object %q", obj)
	}
	if t == nil {
		return fmt.Errorf("no such table: %w", unix.ENOENT)
	}
	if len(w) < 4 {
		return fmt.Errorf("no chain name")
	}
	name := w[3].s
	c := t.chain(name)
	if obj == "chain" {
		switch verb {
		case "add", "create":
			if c != nil && verb == "create" {
				return fmt.Errorf("chain exists: %w", unix.EEXIST)
			}
			if c == nil {
				c = &Chain{Family: fam, Table: k.name, Name: name}
				t.chains = append(t.chains, c)
			}
			return applyChainBlock(t, c, st.block)
		case "delete", "destroy":
			switch {
			case c == nil && verb == "destroy":
				return nil
			case c == nil:
				return fmt.Errorf("no such chain: %w", unix.ENOENT)
			case t.referenced(name):
				// As the kernel: the chain's own rules go with it; rules of
				// other chains that jump to it keep it (EBUSY).
				return fmt.Errorf("chain in use: %w", unix.EBUSY)
			}
			t.chains = slices.DeleteFunc(t.chains, func(x *Chain) bool { return x.Name == name })
		case "flush":
			if c == nil {
				return fmt.Errorf("no such chain: %w", unix.ENOENT)
			}
			c.Rules = nil
		default:
			return fmt.Errorf("%s chain is not supported", verb)
		}
		return nil
	}
	// rule
	if c == nil {
		return fmt.Errorf("no such chain: %w", unix.ENOENT)
	}
	rest := w[4:]
	switch verb {
	case "add", "insert":
		at := -1
		if verb == "insert" {
			at = 0
		}
		if len(rest) >= 2 && (rest[0].s == "position" || rest[0].s == "handle" || rest[0].s == "index") {
			h, _ := strconv.ParseUint(rest[1].s, 10, 64)
			i := slices.IndexFunc(c.Rules, func(r Rule) bool { return r.Handle == h })
			if rest[0].s == "index" {
				i = int(h)
			} else if i < 0 {
				return fmt.Errorf("no rule with handle %d: %w", h, unix.ENOENT)
			}
			if verb == "add" {
				i++
			}
			at, rest = i, rest[2:]
		}
		return t.addRule(c, nftRule(fam, rest), at)
	case "delete", "destroy":
		if len(rest) != 2 || rest[0].s != "handle" {
			return fmt.Errorf("delete rule needs a handle")
		}
		h, _ := strconv.ParseUint(rest[1].s, 10, 64)
		i := slices.IndexFunc(c.Rules, func(r Rule) bool { return r.Handle == h })
		if i < 0 {
			if verb == "destroy" {
				return nil
			}
			return fmt.Errorf("no rule with handle %d: %w", h, unix.ENOENT)
		}
		c.Rules = slices.Delete(c.Rules, i, i+1)
		return nil
	}
	return fmt.Errorf("%s rule is not supported", verb)
}

func applyTableBlock(t *fakeTable, fam TableFamily, table string, block []nftStmt) error {
	// nft declares a block's chains before it adds their rules, so that a
	// rule may jump to a chain defined further down.
	for _, st := range block {
		if w := st.words; len(w) == 2 && w[0].s == "chain" && t.chain(w[1].s) == nil {
			t.chains = append(t.chains, &Chain{Family: fam, Table: table, Name: w[1].s})
		}
	}
	for _, st := range block {
		w := st.words
		switch {
		case len(w) == 2 && w[0].s == "comment":
			t.comment = w[1].s
		case len(w) >= 1 && w[0].s == "flags":
		case len(w) == 2 && w[0].s == "chain":
			c := t.chain(w[1].s)
			if c == nil {
				c = &Chain{Family: fam, Table: table, Name: w[1].s}
				t.chains = append(t.chains, c)
			}
			if err := applyChainBlock(t, c, st.block); err != nil {
				return fmt.Errorf("chain %s: %w", w[1].s, err)
			}
		default:
			return fmt.Errorf("unsupported in a table: %s", stmtText(st))
		}
	}
	return nil
}

func applyChainBlock(t *fakeTable, c *Chain, block []nftStmt) error {
	for _, st := range block {
		w := st.words
		switch {
		case len(w) == 0:
		case w[0].s == "type":
			for i := range w {
				if w[i].s == "hook" && i+1 < len(w) {
					c.Hook = w[i+1].s
				}
			}
		case w[0].s == "policy":
		case len(w) == 2 && w[0].s == "comment":
			c.Comment = w[1].s
		default:
			if err := t.addRule(c, nftRule(c.Family, w), -1); err != nil {
				return err
			}
		}
	}
	return nil
}

// nftRule reads a rule statement into the typed fields.
func nftRule(fam TableFamily, w []nftTok) Rule {
	r := Rule{Family: fam, Spec: stmtText(nftStmt{words: w})}
	word := func(i int) string {
		if i < len(w) {
			return w[i].s
		}
		return ""
	}
	for i := 0; i < len(w); i++ {
		// value reads the operand at i+1, with an optional "!=" before it.
		value := func() (string, bool) {
			i++
			if word(i) == "!=" {
				i++
				return word(i), true
			}
			if word(i) == "==" {
				i++
			}
			return word(i), false
		}
		switch x := word(i); x {
		case "meta":
			i++
			switch key := word(i); key {
			case "nfproto":
				v, _ := value()
				r.IPFamily = map[string]Family{"ipv4": V4, "ipv6": V6}[v]
			case "l4proto":
				r.Proto, _ = value()
			case "iifname", "oifname":
				v, _ := value()
				r.setInterface(key, v)
			case "mark":
				switch {
				case word(i+1) == "set":
					i += 2
					if r.Target == "" {
						r.Target = "MARK" // else the mark of a tproxy
					}
					if word(i) == "meta" && word(i+1) == "mark" && word(i+2) == "or" {
						i += 3
					} else if word(i) == "ct" && word(i+1) == "mark" {
						i++
						r.unknown("meta mark set ct mark")
						continue
					}
					v, _ := strconv.ParseUint(word(i), 0, 32)
					r.SetMark = uint32(v)
				case word(i+1) == "&":
					m, _ := strconv.ParseUint(word(i+2), 0, 32)
					i += 2
					v, neq := value()
					n, _ := strconv.ParseUint(v, 0, 32)
					r.HasMark, r.Mark, r.MarkMask, r.NotMark = true, uint32(n), uint32(m), neq
				default:
					v, neq := value()
					n, _ := strconv.ParseUint(v, 0, 32)
					r.HasMark, r.Mark, r.MarkMask, r.NotMark = true, uint32(n), 0xffffffff, neq
				}
			default:
				r.unknown("meta " + key)
				value()
			}
		case "iifname", "oifname":
			v, _ := value()
			r.setInterface(x, v)
		case "ip", "ip6":
			i++
			dir := word(i)
			v, neq := value()
			p := parsePrefix(V4, v)
			switch dir {
			case "saddr":
				r.Src, r.NotSrc = p, neq
			case "daddr":
				r.Dst, r.NotDst = p, neq
			default:
				r.unknown(x + " " + dir)
			}
			if fam == Inet || fam == Bridge {
				r.IPFamily = map[string]Family{"ip": V4, "ip6": V6}[x]
			}
		case "tcp", "udp", "sctp":
			r.Proto = x
			i++
			dir := word(i)
			v, neq := value()
			n, _ := strconv.ParseUint(v, 10, 16)
			switch dir {
			case "dport":
				r.DPort, r.NotDPort = uint16(n), neq
			case "sport":
				r.SPort = uint16(n)
			default:
				r.unknown(x + " " + dir)
			}
		case "fib":
			if word(i+1) == "daddr" && word(i+2) == "type" && word(i+3) == "local" {
				r.DstLocal = true
				i += 3
			} else {
				r.unknown("fib")
			}
		case "ct":
			r.unknown("ct")
			i++
			if word(i+1) == "set" {
				r.Target = "CONNMARK"
				i += 2
				if word(i) == "meta" {
					i++
				}
			} else {
				value()
			}
		case "ether":
			r.unknown("ether")
			i++
			value()
		case "counter":
		case "comment":
			i++
			r.Comment = word(i)
		case "jump", "goto":
			i++
			r.Jump, r.Goto = word(i), x == "goto"
		case "accept", "drop", "return":
			if r.Target == "" || r.Target == "MARK" {
				r.Target = strings.ToUpper(x)
			}
		case "masquerade":
			r.Target = "MASQUERADE"
		case "dnat", "snat":
			r.Target = strings.ToUpper(x)
			i++
			if word(i) == "ip" || word(i) == "ip6" {
				i++
			}
			if word(i) == "to" {
				i++
			}
			r.ToDest = parseAddrPort(word(i))
		case "redirect", "tproxy":
			r.Target = map[string]string{"redirect": "REDIRECT", "tproxy": "TPROXY"}[x]
			for i+1 < len(w) && (word(i+1) == "to" || word(i+1) == "ip" || word(i+1) == "ip6") {
				i++
			}
			if p := word(i + 1); strings.HasPrefix(p, ":") {
				n, _ := strconv.ParseUint(p[1:], 10, 16)
				r.ToPort = uint16(n)
				i++
			}
		default:
			r.unknown(x)
		}
	}
	return r
}

// setInterface sets the input (iifname) or output (oifname) interface,
// written with or without "meta".
func (r *Rule) setInterface(key, name string) {
	if key == "iifname" {
		r.In = name
	} else {
		r.Out = name
	}
}
