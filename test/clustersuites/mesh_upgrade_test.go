//go:build cluster

package clustersuites

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/podstate"
	"github.com/meshwire/meshwire/test/clustersuites/framework"
)

// layoutOf is the node's meshwire state directory, as the host sees it.
func layoutOf(n framework.Node) nodelayout.Layout {
	return nodelayout.At(filepath.Join(n.VarLibCNI, "meshwire"))
}

// fourStores counts, per node, the files of the stores that meshwire kept
// before one record per pod (the intercept plugin's calls and fast-path
// records, the agent's enrolled pods): the nodes of a cluster started
// FROM such a commit must hold the meshed pods' state there, or the
// upgrade would prove nothing.
func (m *mesh) fourStores() map[string]stores {
	t := m.t
	files := map[string]stores{}
	total := 0
	for _, n := range m.c.Nodes {
		l := layoutOf(n)
		var s stores
		for i, d := range []string{l.LegacyCalls(), l.LegacyFastpath(), l.LegacyEnrolled()} {
			entries, err := os.ReadDir(d)
			if err != nil && !os.IsNotExist(err) {
				framework.Require(t, "the earlier store "+d+" of "+n.Name, err)
			}
			s[i] = len(entries)
			total += len(entries)
		}
		files[n.Name] = s
		t.Logf("%s before the upgrade from %.12s: %d calls, %d fast-path records, %d enrolled pods in the earlier stores", n.Name, m.c.From, s[0], s[1], s[2])
	}
	framework.Checkf(t, fmt.Sprintf("before the upgrade from %.12s: the meshed pods' state is in the earlier stores (%d files)", m.c.From, total),
		total > 0, "no file: the nodes did not start on a meshwire that kept them")
	return files
}

// stores counts the files of the earlier stores: calls, fast-path
// records, enrolled pods.
type stores [3]int

// oneRecordPerPod: after the upgrade, each node's earlier stores are
// empty, and the pods' records hold as many calls and fast-path policies
// as the earlier stores held at least (the agent moved them when it
// started; the pods started since add theirs).
func (m *mesh) oneRecordPerPod(before map[string]stores) {
	t := m.t
	for _, n := range m.c.Nodes {
		l := layoutOf(n)
		left := 0
		for _, d := range l.Legacy() {
			entries, _ := os.ReadDir(d)
			left += len(entries)
		}
		recs, err := podstate.New(l).List()
		framework.Require(t, "the pods' records on "+n.Name, err)
		calls, fast := 0, 0
		for _, r := range recs {
			if r.Call != nil {
				calls++
			}
			if r.Fastpath != nil {
				fast++
			}
		}
		t.Logf("%s after the upgrade: %d records, %d with the plugin's call, %d with a fast-path policy; %d files left in the earlier stores", n.Name, len(recs), calls, fast, left)
		framework.Checkf(t, n.Name+": the earlier stores are empty after the upgrade", left == 0, "%d files left", left)
		b := before[n.Name]
		framework.Checkf(t, n.Name+": every call and fast-path record of the earlier stores is in the pods' records", calls >= b[0] && fast >= b[1],
			"%d calls and %d fast-path records before, %d and %d in the pods' records now", b[0], b[1], calls, fast)
	}
}
