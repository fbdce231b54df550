package firewall

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Reading, writing and removing rules over netlink, in the calling thread's
// network namespace. A firewall tool costs a process start and, for
// iptables-nft, a read of the whole table plus a generation-checked commit
// that is retried from scratch whenever another writer committed first:
// with 20 pods set up or torn down at once, most of the firewall work went
// there. A rule appended or removed by handle needs none of that.

// NFTablesBacked reports whether b's iptables rules live in nf_tables (the
// iptables-nft variant, or a default `iptables` that is iptables-nft), so
// that they can be read and removed with ChainRules and DeleteRules.
func (b Backend) NFTablesBacked() bool {
	switch {
	case b.Kind != IPTables:
		return false
	case b.Variant == VariantNFT:
		return true
	case b.Variant == VariantLegacy:
		return false
	}
	return defaultIsNFT()
}

// defaultIsNFT: both families' default tools are iptables-nft. Debian
// switches iptables and ip6tables as separate alternatives; when only one of
// them is the nft variant, the tools are used for both (rules written over
// netlink for one family would be invisible to the other's tools).
var defaultIsNFT = sync.OnceValue(func() bool {
	return isNFTTool(resolveTool("iptables-restore")) && isNFTTool(resolveTool("ip6tables-restore"))
})

// resolveTool follows a tool's symlinks (Debian's alternatives) to the
// binary that implements it; "" when it is not installed.
func resolveTool(name string) string {
	p, err := exec.LookPath(name)
	if err != nil {
		return ""
	}
	if r, err := filepath.EvalSymlinks(p); err == nil {
		p = r
	}
	return filepath.Base(p)
}

// isNFTTool tells an iptables-nft binary (xtables-nft-multi,
// iptables-nft-restore) from a legacy one (xtables-legacy-multi, the
// single-binary iptables-restore of iptables < 1.8).
func isNFTTool(base string) bool { return strings.Contains(base, "nft") }

// Rule (rule.go) is one rule as meshwire reads it back.

func famName(f Family) string {
	if f == V6 {
		return "ip6"
	}
	return "ip"
}

func nfproto(f Family) byte {
	if f == V6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// Conn is a netlink connection to nf_tables in the calling thread's network
// namespace, for a series of reads and transactions. It speaks the few
// messages meshwire needs directly, reading into one reused buffer: a rule
// dump of a busy node's nat table is then a few reads and no allocation per
// rule but its comment.
//
// Closing the last descriptor of a netfilter netlink socket waits until the
// kernel has freed everything any transaction removed, node-wide (an RCU
// grace period: 10 to 30 ms here, more under load): always after this
// connection removed something, and whenever another process's removal is
// still being freed. Release lets a caller that committed a change hand that
// wait to a process that outlives it.
type Conn struct {
	fd        int
	seq       uint32
	buf       []byte
	committed bool
}

// connTimeout bounds one exchange with the kernel.
const connTimeout = 10 * time.Second

// Open opens a connection.
func Open() (*Conn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("nf_tables: netlink socket: %w", err)
	}
	tv := unix.NsecToTimeval(connTimeout.Nanoseconds())
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("nf_tables: netlink bind: %w", err)
	}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("nf_tables: netlink socket: %w", err)
	}
	return &Conn{fd: fd, seq: rand.Uint32(), buf: make([]byte, 64<<10)}, nil
}

// Close closes the connection (waiting, when a removal was committed, as
// described at Conn). It is safe to call more than once.
func (c *Conn) Close() error {
	if c.fd < 0 {
		return nil
	}
	err := unix.Close(c.fd)
	c.fd = -1
	return err
}

// Release closes the connection. When a transaction was committed on it, it
// first duplicates the socket and returns the duplicate, which the caller
// passes to a process that outlives it (detach.StartHolding) and then
// closes, so that its own close is not the last; otherwise it returns nil.
func (c *Conn) Release() *os.File {
	var dup *os.File
	if c.committed && c.fd >= 0 {
		if nfd, err := unix.FcntlInt(uintptr(c.fd), unix.F_DUPFD_CLOEXEC, 0); err == nil {
			dup = os.NewFile(uintptr(nfd), "nf_tables")
		}
	}
	_ = c.Close()
	return dup
}

// attr is one netlink attribute to send.
type attr struct {
	typ  uint16
	data []byte
}

func strAttr(typ uint16, s string) attr { return attr{typ, append([]byte(s), 0)} }

func align4(n int) int { return (n + 3) &^ 3 }

// appendMsg appends one nf_tables message to b and returns it with the
// sequence number used.
func (c *Conn) appendMsg(b []byte, typ uint16, flags uint16, family byte, resID uint16, attrs ...attr) ([]byte, uint32) {
	c.seq++
	start := len(b)
	b = binary.NativeEndian.AppendUint32(b, 0) // length, set below
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, c.seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, family, unix.NFNETLINK_V0)
	b = binary.BigEndian.AppendUint16(b, resID)
	for _, a := range attrs {
		b = appendAttr(b, a)
	}
	binary.NativeEndian.PutUint32(b[start:], uint32(len(b)-start))
	return b, c.seq
}

func nftType(msg int) uint16 { return uint16(unix.NFNL_SUBSYS_NFTABLES<<8 | msg) }

func (c *Conn) send(b []byte) error {
	if err := unix.Sendto(c.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return os.NewSyscallError("sendto", err)
	}
	return nil
}

// receive reads messages and passes those answering seqs to fn (type,
// sequence number and payload after the netlink header; the payload is only
// valid during the call) until fn reports done. An error message is
// returned as its errno; an acknowledgement is passed to fn as NLMSG_ERROR
// with errno 0.
func (c *Conn) receive(seqs func(uint32) bool, fn func(typ uint16, seq uint32, payload []byte) (done bool)) error {
	for {
		n, _, err := unix.Recvfrom(c.fd, c.buf, 0)
		if err != nil {
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if errors.Is(err, unix.EAGAIN) {
				return fmt.Errorf("no answer from the kernel in %v", connTimeout)
			}
			return os.NewSyscallError("recvfrom", err)
		}
		b := c.buf[:n]
		for len(b) >= unix.NLMSG_HDRLEN {
			l := int(binary.NativeEndian.Uint32(b[0:4]))
			if l < unix.NLMSG_HDRLEN || l > len(b) {
				return fmt.Errorf("malformed netlink message")
			}
			typ := binary.NativeEndian.Uint16(b[4:6])
			seq := binary.NativeEndian.Uint32(b[8:12])
			payload := b[unix.NLMSG_HDRLEN:l]
			b = b[min(align4(l), len(b)):]
			if !seqs(seq) {
				continue // the answer to an earlier, abandoned request
			}
			if typ == unix.NLMSG_ERROR && len(payload) >= 4 {
				if errno := -int32(binary.NativeEndian.Uint32(payload[:4])); errno != 0 {
					return unix.Errno(errno)
				}
			}
			if fn(typ, seq, payload) {
				return nil
			}
		}
	}
}

// eachAttr calls fn with the type (flags masked) and data of each attribute
// in b.
func eachAttr(b []byte, fn func(typ uint16, data []byte)) {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < 4 || l > len(b) {
			return
		}
		fn(binary.NativeEndian.Uint16(b[2:4])&^uint16(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), b[4:l])
		b = b[min(align4(l), len(b)):]
	}
}

// cstr is a NUL-terminated attribute's text, without copying.
func cstr(b []byte) []byte {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		return b[:i]
	}
	return b
}

// generation returns the ruleset's generation, which every commit advances.
func (c *Conn) generation() (uint32, error) {
	req, seq := c.appendMsg(nil, nftType(unix.NFT_MSG_GETGEN), unix.NLM_F_REQUEST, unix.AF_UNSPEC, 0)
	if err := c.send(req); err != nil {
		return 0, err
	}
	var gen uint32
	found := false
	err := c.receive(func(s uint32) bool { return s == seq }, func(typ uint16, _ uint32, payload []byte) bool {
		if typ == nftType(unix.NFT_MSG_NEWGEN) && len(payload) >= 4 {
			eachAttr(payload[4:], func(t uint16, d []byte) {
				if t == unix.NFTA_GEN_ID && len(d) == 4 {
					gen, found = binary.BigEndian.Uint32(d), true
				}
			})
		}
		return true
	})
	if err == nil && !found {
		err = fmt.Errorf("no generation in the answer")
	}
	if err != nil {
		return 0, fmt.Errorf("read the ruleset generation: %w", err)
	}
	return gen, nil
}

// dumpPatience bounds the time spent reading again a dump that writers
// keep changing (iptables-nft retries without a bound).
const dumpPatience = 2 * time.Second

// dump runs an nf_tables dump request and passes each object's attributes
// to each, after begin. A dump spans several reads, and a commit in between
// shifts the kernel's position in the list it walks, so that objects are
// skipped: the dump counts only when the ruleset's generation is the same
// before and after it, and is read again (begin is called again) otherwise.
func (c *Conn) dump(msg int, family byte, attrs []attr, begin func(), each func(obj []byte)) error {
	start := time.Now()
	for attempt := 1; ; attempt++ {
		before, err := c.generation()
		if err != nil {
			return err
		}
		begin()
		req, seq := c.appendMsg(nil, nftType(msg), unix.NLM_F_REQUEST|unix.NLM_F_DUMP, family, 0, attrs...)
		if err := c.send(req); err != nil {
			return err
		}
		var status error
		err = c.receive(func(s uint32) bool { return s == seq }, func(typ uint16, _ uint32, payload []byte) bool {
			if typ == unix.NLMSG_DONE {
				// A dump the kernel cut short says so here.
				if len(payload) >= 4 {
					if v := int32(binary.NativeEndian.Uint32(payload[:4])); v < 0 {
						status = unix.Errno(-v)
					}
				}
				return true
			}
			if len(payload) >= 4 {
				each(payload[4:])
			}
			return false
		})
		if err == nil {
			err = status
		}
		if err != nil {
			return err
		}
		after, err := c.generation()
		if err != nil {
			return err
		}
		if before == after {
			return nil
		}
		if time.Since(start) > dumpPatience {
			return fmt.Errorf("the ruleset changed during each of %d reads in %v", attempt, dumpPatience)
		}
		// Back off, with jitter, so that readers do not keep meeting the
		// same writers.
		time.Sleep(min(time.Duration(attempt), 20) * time.Duration(50+rand.IntN(100)) * time.Microsecond)
	}
}

// batch commits msgs (built by build with the batch's sequence numbers and
// without NLM_F_ACK) as one nf_tables transaction and waits for its outcome.
// Only the last message asks for an acknowledgement: the kernel reports
// every failing message anyway, so the answer is one message however large
// the batch (an acknowledgement per message, each carrying a copy of its
// request, can overrun the socket's buffer before anything is read). Errors
// the kernel reports against the batch header itself (no permission, no
// nf_tables, out of memory) end the wait too.
func (c *Conn) batch(build func(b []byte) []byte) error {
	b, first := c.appendMsg(nil, unix.NFNL_MSG_BATCH_BEGIN, unix.NLM_F_REQUEST, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)
	begin := len(b)
	b = build(b)
	if len(b) == begin {
		return errors.New("empty transaction")
	}
	// Find the last message and ask for its acknowledgement.
	lastOff := begin
	for off := begin; off < len(b); off += align4(int(binary.NativeEndian.Uint32(b[off:]))) {
		lastOff = off
	}
	flags := binary.NativeEndian.Uint16(b[lastOff+6:])
	binary.NativeEndian.PutUint16(b[lastOff+6:], flags|unix.NLM_F_ACK)
	acked := binary.NativeEndian.Uint32(b[lastOff+8:])
	b, last := c.appendMsg(b, unix.NFNL_MSG_BATCH_END, unix.NLM_F_REQUEST, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES)
	if err := c.send(b); err != nil {
		return err
	}
	// Answers to any message of the batch, its header included, count.
	return c.receive(func(s uint32) bool { return s-first <= last-first }, func(typ uint16, seq uint32, _ []byte) bool {
		return typ == unix.NLMSG_ERROR && seq == acked
	})
}

// ChainRules returns the rules of chain in the iptables-nft table of family
// f (table "nat" is `ip nat` for V4, `ip6 nat` for V6). A table or chain that
// is not there has no rules.
func (c *Conn) ChainRules(f Family, table, chain string) ([]Rule, error) {
	var rules []Rule
	err := c.dump(unix.NFT_MSG_GETRULE, nfproto(f), []attr{strAttr(unix.NFTA_RULE_TABLE, table), strAttr(unix.NFTA_RULE_CHAIN, chain)},
		func() { rules = rules[:0] },
		func(obj []byte) { rules = append(rules, parseRule(obj)) })
	if errors.Is(err, unix.ENOENT) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("nf_tables: read %s %s %s: %w", famName(f), table, chain, err)
	}
	return rules, nil
}

// parseRule reads what Rule holds from a rule's attributes: its handle, its
// comment (the rule's userdata, or a comment match) and its target (an
// xtables target's name, or MASQUERADE for a native masq).
func parseRule(b []byte) Rule {
	var r Rule
	eachAttr(b, func(typ uint16, d []byte) {
		switch typ {
		case unix.NFTA_RULE_HANDLE:
			if len(d) == 8 {
				r.Handle = binary.BigEndian.Uint64(d)
			}
		case unix.NFTA_RULE_USERDATA:
			// TLVs of one byte type and one byte length; type 0 is the comment.
			for len(d) >= 2 && len(d) >= 2+int(d[1]) {
				if d[0] == 0 {
					r.Comment = string(cstr(d[2 : 2+int(d[1])]))
				}
				d = d[2+int(d[1]):]
			}
		case unix.NFTA_RULE_EXPRESSIONS:
			eachAttr(d, func(_ uint16, elem []byte) { parseExpr(elem, &r) })
		}
	})
	return r
}

func parseExpr(elem []byte, r *Rule) {
	var name, data []byte
	eachAttr(elem, func(typ uint16, d []byte) {
		switch typ {
		case unix.NFTA_EXPR_NAME:
			name = cstr(d)
		case unix.NFTA_EXPR_DATA:
			data = d
		}
	})
	switch string(name) {
	case "masq":
		r.Target = "MASQUERADE"
	case "match", "target":
		var xname, info []byte
		eachAttr(data, func(typ uint16, d []byte) {
			switch typ {
			case unix.NFTA_MATCH_NAME: // NFTA_TARGET_NAME
				xname = cstr(d)
			case unix.NFTA_MATCH_INFO: // NFTA_TARGET_INFO
				info = d
			}
		})
		if string(name) == "target" {
			r.Target = string(xname)
		} else if string(xname) == "comment" {
			r.Comment = string(cstr(info))
		}
	}
}

// DeleteRules removes the rules with the given handles from chain in one
// transaction. A rule already gone (another DEL of the same attachment got
// there first) makes the transaction fail as a whole.
func (c *Conn) DeleteRules(f Family, table, chain string, handles []uint64) error {
	if len(handles) == 0 {
		return nil
	}
	err := c.batch(func(b []byte) []byte {
		for _, h := range handles {
			b, _ = c.appendMsg(b, nftType(unix.NFT_MSG_DELRULE), unix.NLM_F_REQUEST, nfproto(f), 0,
				strAttr(unix.NFTA_RULE_TABLE, table), strAttr(unix.NFTA_RULE_CHAIN, chain),
				attr{unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, h)})
		}
		return b
	})
	if err != nil {
		return fmt.Errorf("nf_tables: delete %d rules from %s %s %s: %w", len(handles), famName(f), table, chain, err)
	}
	c.committed = true
	return nil
}

// DeleteTagged removes every rule of chain whose comment sel accepts, in
// one transaction, and reports how many went. A concurrent removal of the
// same rules is tolerated: the chain is read again and what is left removed.
func (c *Conn) DeleteTagged(f Family, table, chain string, sel func(comment string) bool) (int, error) {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		var rules []Rule
		rules, err = c.ChainRules(f, table, chain)
		if err != nil {
			return 0, err
		}
		var handles []uint64
		for _, r := range rules {
			if sel(r.Comment) {
				handles = append(handles, r.Handle)
			}
		}
		if err = c.DeleteRules(f, table, chain, handles); err == nil {
			return len(handles), nil
		}
		if !errors.Is(err, unix.ENOENT) {
			return 0, err // not a rule another process removed first
		}
	}
	return 0, err
}

// TableFamily is the family of a native nftables table.
type TableFamily byte

const (
	Inet   TableFamily = unix.NFPROTO_INET
	Bridge TableFamily = unix.NFPROTO_BRIDGE
)

func (f TableFamily) String() string { return f.Name() }

// Tables lists the names of the native nftables tables of family fam.
func (c *Conn) Tables(fam TableFamily) ([]string, error) {
	var names []string
	err := c.dump(unix.NFT_MSG_GETTABLE, byte(fam), nil,
		func() { names = names[:0] },
		func(obj []byte) {
			eachAttr(obj, func(typ uint16, d []byte) {
				if typ == unix.NFTA_TABLE_NAME {
					names = append(names, string(cstr(d)))
				}
			})
		})
	if err != nil {
		return nil, fmt.Errorf("nf_tables: list %s tables: %w", fam, err)
	}
	return names, nil
}

// DeleteTables deletes the tables of family fam named, with everything in
// them, in one transaction; a table that is not there is no error (it is
// added and deleted, as `nft 'add table …; delete table …'` does).
func (c *Conn) DeleteTables(fam TableFamily, names []string) error {
	if len(names) == 0 {
		return nil
	}
	err := c.batch(func(b []byte) []byte {
		for _, n := range names {
			b, _ = c.appendMsg(b, nftType(unix.NFT_MSG_NEWTABLE), unix.NLM_F_REQUEST|unix.NLM_F_CREATE, byte(fam), 0,
				strAttr(unix.NFTA_TABLE_NAME, n), attr{unix.NFTA_TABLE_FLAGS, []byte{0, 0, 0, 0}})
			b, _ = c.appendMsg(b, nftType(unix.NFT_MSG_DELTABLE), unix.NLM_F_REQUEST, byte(fam), 0,
				strAttr(unix.NFTA_TABLE_NAME, n))
		}
		return b
	})
	if err != nil {
		return fmt.Errorf("nf_tables: delete %s tables %s: %w", fam, strings.Join(names, ", "), err)
	}
	c.committed = true
	return nil
}
