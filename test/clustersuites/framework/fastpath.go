package framework

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// FastpathCount is what a node's fast path has done since it was attached
// (its agent's counters).
type FastpathCount struct {
	// Messages is meshwire_fastpath_redirected_messages_total.
	Messages float64
	// PeerPairs is meshwire_fastpath_peer_pairs_total: sidecar-to-sidecar
	// connections between two pods of the node.
	PeerPairs float64
}

// FastpathCounts reads the fast path's counters of each node, by node
// name; a node where it is not attached, or whose agent does not answer,
// is absent.
func FastpathCounts(ctx context.Context, nodes []Node) map[string]FastpathCount {
	out := map[string]FastpathCount{}
	for _, n := range nodes {
		m, err := Metrics(ctx, n)
		if err != nil || m["meshwire_fastpath_attached"] != 1 {
			continue
		}
		out[n.Name] = FastpathCount{Messages: m["meshwire_fastpath_redirected_messages_total"], PeerPairs: m["meshwire_fastpath_peer_pairs_total"]}
	}
	return out
}

// FastpathCarried judges one placement's loads of requests requests
// between the counters before and after: on each of nodes (those that
// run a pod of the loads: the client's, the server's) the fast path
// carried at least a message per request. Through a sidecar each node
// has an app <-> sidecar hop of every request, whatever the other node
// does: a sum over the nodes would hide a node whose fast path carried
// nothing.
func FastpathCarried(before, after map[string]FastpathCount, nodes []string, requests int64) error {
	nodes = slices.Clone(nodes)
	slices.Sort(nodes)
	nodes = slices.Compact(nodes)
	var errs []error
	for _, n := range nodes {
		b, okB := before[n]
		a, okA := after[n]
		switch d := a.Messages - b.Messages; {
		case !okB || !okA:
			errs = append(errs, fmt.Errorf("%s: the fast path not attached (before %v, after %v)", n, okB, okA))
		case d < 0:
			errs = append(errs, fmt.Errorf("%s: its counter went from %.0f to %.0f (attached again meanwhile)", n, b.Messages, a.Messages))
		case d < float64(requests):
			errs = append(errs, fmt.Errorf("%s: %.0f messages for %d requests", n, d, requests))
		}
	}
	return errors.Join(errs...)
}
