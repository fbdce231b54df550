package fastpath

import (
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"

	"github.com/meshwire/meshwire/ebpf/loader"
)

// Counters are totals since attach.
type Counters struct {
	Sockets            uint64 `json:"sockets"`
	Pairs              uint64 `json:"pairs"`
	RedirectedMessages uint64 `json:"redirected_messages"`
	RedirectedBytes    uint64 `json:"redirected_bytes"`
	Fallbacks          uint64 `json:"fallbacks"`
	Ambiguous          uint64 `json:"ambiguous"`
	KeptForProxy       uint64 `json:"kept_for_proxy"`
	// PeerPairs: of Pairs, connections between the sidecars of two pods
	// of this node.
	PeerPairs uint64 `json:"peer_pairs"`
}

// Sub returns c - o, counter by counter (what happened between two reads).
func (c Counters) Sub(o Counters) Counters {
	return Counters{
		Sockets: c.Sockets - o.Sockets, Pairs: c.Pairs - o.Pairs,
		RedirectedMessages: c.RedirectedMessages - o.RedirectedMessages, RedirectedBytes: c.RedirectedBytes - o.RedirectedBytes,
		Fallbacks: c.Fallbacks - o.Fallbacks, Ambiguous: c.Ambiguous - o.Ambiguous, KeptForProxy: c.KeptForProxy - o.KeptForProxy,
		PeerPairs: c.PeerPairs - o.PeerPairs,
	}
}

// Add returns c + o, counter by counter.
func (c Counters) Add(o Counters) Counters {
	return Counters{
		Sockets: c.Sockets + o.Sockets, Pairs: c.Pairs + o.Pairs,
		RedirectedMessages: c.RedirectedMessages + o.RedirectedMessages, RedirectedBytes: c.RedirectedBytes + o.RedirectedBytes,
		Fallbacks: c.Fallbacks + o.Fallbacks, Ambiguous: c.Ambiguous + o.Ambiguous, KeptForProxy: c.KeptForProxy + o.KeptForProxy,
		PeerPairs: c.PeerPairs + o.PeerPairs,
	}
}

// counter indexes mw_counters, in the order of fastpath.c's enum counter.
const (
	cSockets = iota
	cPairs
	cMessages
	cBytes
	cFallbacks
	cAmbiguous
	cKeptForProxy
	cPeerPairs
	cMax
)

func readCounters(path string) (Counters, error) {
	sum, err := loader.SumCounters(path, cMax)
	if err != nil {
		return Counters{}, err
	}
	return Counters{
		Sockets: sum[cSockets], Pairs: sum[cPairs], RedirectedMessages: sum[cMessages],
		RedirectedBytes: sum[cBytes], Fallbacks: sum[cFallbacks], Ambiguous: sum[cAmbiguous],
		KeptForProxy: sum[cKeptForProxy], PeerPairs: sum[cPeerPairs],
	}, nil
}

// CountSockets counts the sockets in the sockhash.
func CountSockets(socks *ebpf.Map) (int, error) {
	var k bpfSockKey
	var v uint64
	n := 0
	it := socks.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		return n, fmt.Errorf("walk the sockhash: %w", err)
	}
	return n, nil
}

// Sockhashes counts the fast path's sockhashes alive in the kernel: the
// attached one, and those of earlier attachments (before a detach or a
// replacement) that sockets still on them keep.
func Sockhashes() (int, error) {
	n := 0
	for id := ebpf.MapID(0); ; {
		next, err := ebpf.MapGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return n, nil
		}
		if err != nil {
			return n, fmt.Errorf("list the kernel's BPF maps: %w", err)
		}
		id = next
		m, err := ebpf.NewMapFromID(id)
		if err != nil {
			continue // gone meanwhile
		}
		info, err := m.Info()
		m.Close()
		if err == nil && info.Name == sockhashName {
			n++
		}
	}
}

// sockhashName is the fast path's sockhash as the kernel names it.
const sockhashName = "mw_socks"
