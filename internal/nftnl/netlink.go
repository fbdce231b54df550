package nftnl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"time"

	"github.com/meshwire/meshwire/internal/ruleset"
	"golang.org/x/sys/unix"
)

// Family is an nf_tables table family (NFPROTO_*), the family of every
// message about a table and what is in it. iptables-nft keeps the IPv4
// tables in IP and the IPv6 ones in IP6.
type Family = ruleset.Family

const (
	IP     = ruleset.IP
	IP6    = ruleset.IP6
	Inet   = ruleset.Inet
	Bridge = ruleset.Bridge
)

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

// Attr is one netlink attribute to send.
type Attr struct {
	Type uint16
	Data []byte
}

// StrAttr is a string attribute (NUL-terminated, as nf_tables wants).
func StrAttr(typ uint16, s string) Attr { return Attr{typ, append([]byte(s), 0)} }

func align4(n int) int { return (n + 3) &^ 3 }

// appendMsg appends one nf_tables message to b and returns it with the
// sequence number used.
func (c *Conn) appendMsg(b []byte, typ uint16, flags uint16, family Family, resID uint16, attrs ...Attr) ([]byte, uint32) {
	c.seq++
	start := len(b)
	b = binary.NativeEndian.AppendUint32(b, 0) // length, set below
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, flags)
	b = binary.NativeEndian.AppendUint32(b, c.seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, byte(family), unix.NFNETLINK_V0)
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

// EachAttr calls fn with the type (flags masked) and data of each attribute
// in b (a message's payload after its nfgenmsg, or a nested attribute's
// data); it stops at the first malformed one.
func EachAttr(b []byte, fn func(typ uint16, data []byte)) {
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < 4 || l > len(b) {
			return
		}
		fn(binary.NativeEndian.Uint16(b[2:4])&^uint16(unix.NLA_F_NESTED|unix.NLA_F_NET_BYTEORDER), b[4:l])
		b = b[min(align4(l), len(b)):]
	}
}

// CStr is a NUL-terminated attribute's text, without copying.
func CStr(b []byte) []byte {
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
			EachAttr(payload[4:], func(t uint16, d []byte) {
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

// Dump runs an nf_tables dump request (msg is an NFT_MSG_GET* type) and
// passes each object's attributes to each, after begin; each's argument is
// only valid during the call. A dump spans several reads, and a commit in between
// shifts the kernel's position in the list it walks, so that objects are
// skipped: the dump counts only when the ruleset's generation is the same
// before and after it, and is read again (begin is called again) otherwise.
func (c *Conn) Dump(msg int, family Family, attrs []Attr, begin func(), each func(obj []byte)) error {
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

// Get runs a non-dump request (msg is an NFT_MSG_GET* type) and passes the
// one answer's attributes to each (only valid during the call). A missing
// object is ENOENT, returned as is.
func (c *Conn) Get(msg int, family Family, attrs []Attr, each func(obj []byte)) error {
	req, seq := c.appendMsg(nil, nftType(msg), unix.NLM_F_REQUEST|unix.NLM_F_ACK, family, 0, attrs...)
	if err := c.send(req); err != nil {
		return err
	}
	return c.receive(func(s uint32) bool { return s == seq }, func(typ uint16, _ uint32, payload []byte) bool {
		if typ == unix.NLMSG_ERROR {
			return true // the acknowledgement, after the object
		}
		if len(payload) >= 4 {
			each(payload[4:])
		}
		return false
	})
}

// UserdataComment reads the comment of a table's, chain's or rule's
// userdata (libnftnl's TLVs: one byte of type, one of length; type 0 is the
// comment); "" when there is none.
func UserdataComment(d []byte) string {
	for len(d) >= 2 && len(d) >= 2+int(d[1]) {
		if d[0] == 0 {
			return string(CStr(d[2 : 2+int(d[1])]))
		}
		d = d[2+int(d[1]):]
	}
	return ""
}

// EachExpr calls fn with the name and data of each expression of a rule's
// expression list (an NFTA_RULE_EXPRESSIONS attribute's data), both only
// valid during the call (the name is not copied: a dump of a long chain
// then allocates nothing per expression).
func EachExpr(list []byte, fn func(name, data []byte)) {
	EachAttr(list, func(_ uint16, elem []byte) {
		var name, data []byte
		EachAttr(elem, func(typ uint16, d []byte) {
			switch typ {
			case unix.NFTA_EXPR_NAME:
				name = CStr(d)
			case unix.NFTA_EXPR_DATA:
				data = d
			}
		})
		fn(name, data)
	})
}

// RuleID names a rule: its table's family and name, its chain and its
// handle.
type RuleID struct {
	Family Family
	Table  string
	Chain  string
	Handle uint64
}

// DeleteRules removes rules by handle, from any chains, in one transaction.
// A rule already gone (another DEL of the same attachment got there first)
// fails the transaction as a whole, with ENOENT.
func (c *Conn) DeleteRules(rules []RuleID) error {
	if len(rules) == 0 {
		return nil
	}
	err := c.batch(func(b []byte) []byte {
		for _, r := range rules {
			b, _ = c.appendMsg(b, nftType(unix.NFT_MSG_DELRULE), unix.NLM_F_REQUEST, r.Family, 0,
				StrAttr(unix.NFTA_RULE_TABLE, r.Table), StrAttr(unix.NFTA_RULE_CHAIN, r.Chain),
				Attr{unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, r.Handle)})
		}
		return b
	})
	if err != nil {
		return fmt.Errorf("nf_tables: delete %d rules: %w", len(rules), err)
	}
	c.committed = true
	return nil
}

// Tables lists the names of the tables of family fam.
func (c *Conn) Tables(fam Family) ([]string, error) {
	var names []string
	err := c.Dump(unix.NFT_MSG_GETTABLE, fam, nil,
		func() { names = names[:0] },
		func(obj []byte) {
			EachAttr(obj, func(typ uint16, d []byte) {
				if typ == unix.NFTA_TABLE_NAME {
					names = append(names, string(CStr(d)))
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
func (c *Conn) DeleteTables(fam Family, names []string) error {
	if len(names) == 0 {
		return nil
	}
	err := c.batch(func(b []byte) []byte {
		for _, n := range names {
			b, _ = c.appendMsg(b, nftType(unix.NFT_MSG_NEWTABLE), unix.NLM_F_REQUEST|unix.NLM_F_CREATE, fam, 0,
				StrAttr(unix.NFTA_TABLE_NAME, n), Attr{unix.NFTA_TABLE_FLAGS, []byte{0, 0, 0, 0}})
			b, _ = c.appendMsg(b, nftType(unix.NFT_MSG_DELTABLE), unix.NLM_F_REQUEST, fam, 0,
				StrAttr(unix.NFTA_TABLE_NAME, n))
		}
		return b
	})
	if err != nil {
		return fmt.Errorf("nf_tables: delete %s tables %s: %w", fam, strings.Join(names, ", "), err)
	}
	c.committed = true
	return nil
}

// TableUserdata is NFTA_TABLE_USERDATA (x/sys/unix does not define it).
const TableUserdata = 6

// BaseChain is the one base chain of a table ReplaceTable writes: `type
// Type hook Hook priority Priority; policy accept;` (Hook is an NF_INET_*
// hook number).
type BaseChain struct {
	Name, Type string
	Hook       uint32
	Priority   int32
}

// ReplaceTable puts table name of family fam in place, with a comment, one
// base chain and its rules (each an expression list), in one transaction
// that deletes the table first when it is there: what `nft -f` does with
// "add table …; delete table …; table … { … }", with no nft process.
func (c *Conn) ReplaceTable(fam Family, name, comment string, chain BaseChain, rules [][]Expr) error {
	var udata []byte
	if comment != "" {
		// libnftnl's TLV: type 0 (comment), length, the text with its NUL.
		if len(comment) > 127 {
			return fmt.Errorf("nf_tables: table %s: comment of %d bytes, the limit is 127", name, len(comment))
		}
		udata = append([]byte{0, byte(len(comment) + 1)}, append([]byte(comment), 0)...)
	}
	table := StrAttr(unix.NFTA_TABLE_NAME, name)
	err := c.batch(func(b []byte) []byte {
		b, _ = c.appendMsg(b, nftType(unix.NFT_MSG_NEWTABLE), unix.NLM_F_REQUEST|unix.NLM_F_CREATE, fam, 0,
			table, Attr{unix.NFTA_TABLE_FLAGS, []byte{0, 0, 0, 0}})
		b, _ = c.appendMsg(b, nftType(unix.NFT_MSG_DELTABLE), unix.NLM_F_REQUEST, fam, 0, table)
		attrs := []Attr{table, {unix.NFTA_TABLE_FLAGS, []byte{0, 0, 0, 0}}}
		if udata != nil {
			attrs = append(attrs, Attr{TableUserdata, udata})
		}
		b, _ = c.appendMsg(b, nftType(unix.NFT_MSG_NEWTABLE), unix.NLM_F_REQUEST|unix.NLM_F_CREATE, fam, 0, attrs...)
		b, _ = c.appendMsg(b, nftType(unix.NFT_MSG_NEWCHAIN), unix.NLM_F_REQUEST|unix.NLM_F_CREATE, fam, 0,
			StrAttr(unix.NFTA_CHAIN_TABLE, name), StrAttr(unix.NFTA_CHAIN_NAME, chain.Name),
			nest(unix.NFTA_CHAIN_HOOK, Attr{unix.NFTA_HOOK_HOOKNUM, be32(chain.Hook)}, Attr{unix.NFTA_HOOK_PRIORITY, be32(uint32(chain.Priority))}),
			Attr{unix.NFTA_CHAIN_POLICY, be32(1)} /* NF_ACCEPT */, StrAttr(unix.NFTA_CHAIN_TYPE, chain.Type))
		for _, exprs := range rules {
			b, _ = c.appendMsg(b, nftType(unix.NFT_MSG_NEWRULE), unix.NLM_F_REQUEST|unix.NLM_F_CREATE|unix.NLM_F_APPEND, fam, 0,
				StrAttr(unix.NFTA_RULE_TABLE, name), StrAttr(unix.NFTA_RULE_CHAIN, chain.Name),
				Attr{unix.NFTA_RULE_EXPRESSIONS | unix.NLA_F_NESTED, EncodeExprs(exprs)})
		}
		return b
	})
	if err != nil {
		return fmt.Errorf("nf_tables: replace %s table %s: %w", fam, name, err)
	}
	c.committed = true
	return nil
}
