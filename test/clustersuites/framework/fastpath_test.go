package framework

import (
	"strings"
	"testing"
)

// TestFastpathCarried judges counters recorded on a cluster of two nodes
// (TestFastpathPlacement: the server and a client on mwk-node1, another
// client on mwk-node2, REDIRECT with the sidecar and the fast path;
// `fortio load -qps 1000 -c 4 -n 2000 -payload-size 64`), and the same
// with mwk-node2's fast path carrying nothing, which the check summed over
// the nodes passed.
func TestFastpathCarried(t *testing.T) {
	const requests = 2000
	// The other node's client: 2 messages per request on each node
	// (the app's request to its sidecar and the answer back).
	otherBefore := map[string]FastpathCount{"mwk-node1": {Messages: 13600, PeerPairs: 8}, "mwk-node2": {Messages: 400}}
	otherAfter := map[string]FastpathCount{"mwk-node1": {Messages: 17600, PeerPairs: 8}, "mwk-node2": {Messages: 4400}}
	// The same node's: 6 per request on mwk-node1 (both sidecars'
	// hops and the sidecar-to-sidecar one), none on mwk-node2.
	sameBefore := map[string]FastpathCount{"mwk-node1": {Messages: 21600, PeerPairs: 8}, "mwk-node2": {Messages: 8400}}
	sameAfter := map[string]FastpathCount{"mwk-node1": {Messages: 33600, PeerPairs: 12}, "mwk-node2": {Messages: 8400}}
	// mwk-node2's fast path took none of its client's connections,
	// mwk-node1's as recorded.
	missed := map[string]FastpathCount{"mwk-node1": {Messages: 17600, PeerPairs: 8}, "mwk-node2": {Messages: 400}}
	var summed float64
	for n, a := range missed {
		summed += a.Messages - otherBefore[n].Messages
	}
	if summed < requests {
		t.Fatalf("the miss's messages summed over the nodes: %.0f, want at least %d (what the summed check passed)", summed, requests)
	}

	for _, tc := range []struct {
		name          string
		before, after map[string]FastpathCount
		nodes         []string // the client's node, the server's
		want          string   // in the error; "" for none
	}{
		{"same node", sameBefore, sameAfter, []string{"mwk-node1", "mwk-node1"}, ""},
		{"other node", otherBefore, otherAfter, []string{"mwk-node2", "mwk-node1"}, ""},
		{"other node, its fast path carried nothing", otherBefore, missed, []string{"mwk-node2", "mwk-node1"}, "mwk-node2: 0 messages for 2000 requests"},
		{"other node, one message in four requests", otherBefore, map[string]FastpathCount{"mwk-node1": {Messages: 17600}, "mwk-node2": {Messages: 900}},
			[]string{"mwk-node2", "mwk-node1"}, "mwk-node2: 500 messages for 2000 requests"},
		{"not attached on the client's node", otherBefore, map[string]FastpathCount{"mwk-node1": {Messages: 17600}},
			[]string{"mwk-node2", "mwk-node1"}, "mwk-node2: the fast path not attached"},
		{"attached again meanwhile", otherBefore, map[string]FastpathCount{"mwk-node1": {Messages: 300}, "mwk-node2": {Messages: 4400}},
			[]string{"mwk-node2", "mwk-node1"}, "mwk-node1: its counter went from 13600 to 300"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := FastpathCarried(tc.before, tc.after, tc.nodes, requests)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("got %v, want no error", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}
