// Package ambientnode enrolls the pods of a node in Istio's ambient mode,
// the job istio-cni's node agent does. For each enrolled pod it installs
// the in-pod rules (package ambient) and policy routing in the pod's
// network namespace, puts the pod's addresses in the probe sets of the
// host rule, and hands the namespace to the node's ztunnel over ZDS
// (package zds: the Node serves ztunnel's socket); it undoes all three
// when the pod leaves ambient or goes. The pods come from their records
// (package podstate), which the intercept plugin writes; whether a pod is
// enrolled is the caller's decision, handed down with the record (Sync).
// What it enrolled is kept in the pod's record, so that a restarted agent
// knows its pods again.
package ambientnode

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"sync"

	"github.com/meshwire/meshwire/internal/agentsocket"
	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/intercept/apply"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/podstate"
	"github.com/meshwire/meshwire/internal/zds"
)

// Decision is the caller's decision for one pod's record.
type Decision struct {
	Enrolled bool
	Why      string // why (not), for logs and the plugin's answer
	// Overrides are what the pod changes of the in-pod rules.
	Overrides ambient.Overrides
	// UID and ServiceAccount are what ztunnel is told of the pod, with
	// its names; UID is the record's when empty.
	UID, ServiceAccount string
	// IPs are the pod's addresses (the API server's), which the probe
	// sets hold; when none, the record's, else those of the pod's
	// namespace.
	IPs []netip.Addr
}

// Options are a Node's.
type Options struct {
	Config ambient.Config
	// Backend programs the in-pod rules and the host rule (the host's).
	Backend firewall.Backend
	// Store holds the pods' records.
	Store podstate.Store
	// ZtunnelSocket is where ztunnel connects.
	ZtunnelSocket string
	// Firewall is the firewall of the calling thread's namespace
	// (firewall.New(Backend) when nil; tests give an in-memory one).
	Firewall func() firewall.Interface
}

// Stats are the node's counters.
type Stats struct {
	Enrolled                      int
	Enrollments, Unenrollments    uint64
	EnrollFailures, HandoffErrors uint64
}

// Node enrolls and unenrolls the pods of this node. Its methods are safe
// to call at once: one pod is acted on at a time.
type Node struct {
	o   Options
	zds *zds.Server
	mu  sync.Mutex // held by each pod's act (Sync), ztunnel's ack waited for
	// pmu guards pods and stats, which Sync changes holding mu too: the
	// snapshot a connecting ztunnel asks for (Workloads) must not wait
	// for an act that waits for that ztunnel.
	pmu   sync.Mutex
	pods  map[string]podstate.Record // the enrolled pods' records, by name
	stats Stats
}

// setPod keeps (or, with ok false, drops) an enrolled pod.
func (n *Node) setPod(name string, r podstate.Record, ok bool) {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	if ok {
		n.pods[name] = r
	} else {
		delete(n.pods, name)
	}
}

// count changes the counters.
func (n *Node) count(f func(*Stats)) {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	f(&n.stats)
}

// New reads the pods the node enrolled before (a restart of the agent)
// from their records and listens on ztunnel's socket; Serve serves it.
func New(o Options) (*Node, error) {
	if o.Config.ProbeSNAT == (ambient.Config{}).ProbeSNAT {
		o.Config.ProbeSNAT = ambient.DefaultProbeSNAT
	}
	if o.Config.ProbeSNATv6 == (ambient.Config{}).ProbeSNATv6 {
		o.Config.ProbeSNATv6 = ambient.DefaultProbeSNATv6
	}
	recs, err := o.Store.List()
	if err != nil {
		return nil, err
	}
	n := &Node{o: o, pods: map[string]podstate.Record{}}
	for name, r := range recs {
		if r.Ambient != nil {
			n.pods[name] = r
		}
	}
	if n.zds, err = zds.Listen(o.ZtunnelSocket, n.Workloads); err != nil {
		return nil, err
	}
	return n, nil
}

// Serve serves ztunnel's socket until ctx ends or Close.
func (n *Node) Serve(ctx context.Context) error { return n.zds.Serve(ctx) }

// Close closes ztunnel's socket (its connections too). The enrolled pods
// stay as they are: their rules, ztunnel's hold on them.
func (n *Node) Close() error { return n.zds.Close() }

// Ztunnels are the ZDS server's gauge and counters.
func (n *Node) Ztunnels() zds.Stats { return n.zds.Stats() }

// workload is the pod of record r as ztunnel is told of it.
func workload(r podstate.Record) zds.Workload {
	uid := r.Ambient.UID
	if uid == "" {
		uid = r.UID
	}
	return zds.Workload{UID: uid, Name: r.Name, Namespace: r.Namespace, ServiceAccount: r.Ambient.ServiceAccount, Netns: r.Open}
}

// Workloads are the enrolled pods whose namespace is still theirs: the
// snapshot ztunnel is sent when it connects.
func (n *Node) Workloads() []zds.Workload {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	out := make([]zds.Workload, 0, len(n.pods))
	for _, r := range n.pods {
		if r.Check() == nil {
			out = append(out, workload(r))
		}
	}
	slices.SortFunc(out, func(a, b zds.Workload) int { return cmp.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name) })
	return out
}

// Enrolled lists the names of the enrolled pods' records.
func (n *Node) Enrolled() []string {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	return slices.Sorted(func(yield func(string) bool) {
		for name := range n.pods {
			if !yield(name) {
				return
			}
		}
	})
}

// Stats returns the node's counters.
func (n *Node) Stats() Stats {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	s := n.stats
	s.Enrolled = len(n.pods)
	return s
}

// Sync acts on the pod of record name: rec as read (present false: there
// is none, its DEL ran) and the caller's decision d for it. It answers as
// the plugin's question expects (package agentsocket). atAdd is the
// plugin's ADD: the pod's containers have not started, and an enrolled
// pod is not let start before ztunnel holds it (no ztunnel connected is
// an error).
func (n *Node) Sync(ctx context.Context, name string, rec podstate.Record, present bool, d Decision, atAdd bool) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	cur, was := n.pods[name]
	if present && rec.Check() != nil {
		// The pod's namespace went without a DEL: its record is the
		// agent's to collect.
		slog.Info("the namespace of the pod is gone; forgetting the pod", "pod", rec.Key(), "containerID", rec.ContainerID, "netns", rec.Netns)
		_ = n.o.Store.Forget(name, rec.NetnsIno)
		present = false
	}
	if !present {
		if was && cur.Check() == nil {
			// DEL with the namespace still there (the runtime may ADD
			// the same sandbox again): its rules go too.
			return agentsocket.AnswerNotEnrolled + ": the pod's DEL ran", n.unenroll(ctx, name, cur)
		}
		if was {
			return agentsocket.AnswerNotEnrolled + ": the pod is gone", n.forget(ctx, name, cur)
		}
		return agentsocket.AnswerNotEnrolled + ": no record of the pod", nil
	}
	if !d.Enrolled {
		if was {
			if err := n.unenroll(ctx, name, cur); err != nil {
				return "", err
			}
			slog.Info("pod left ambient mode", "pod", rec.Key(), "why", d.Why)
		}
		return agentsocket.AnswerNotEnrolled + ": " + d.Why, nil
	}
	want := podstate.Enrollment{Why: d.Why, Overrides: d.Overrides, UID: d.UID, ServiceAccount: d.ServiceAccount, Backend: n.o.Backend.String()}
	if was && same(cur, rec, want, d.IPs) {
		return agentsocket.AnswerEnrolled, nil
	}
	if atAdd && n.zds.Stats().Connected == 0 {
		return "", fmt.Errorf("pod %s is enrolled in ambient mode and no ztunnel is connected to the node agent", rec.Key())
	}
	if err := n.enroll(ctx, name, rec, want, d.IPs, was); err != nil {
		n.count(func(s *Stats) { s.EnrollFailures++ })
		return "", fmt.Errorf("enroll pod %s in ambient mode: %w", rec.Key(), err)
	}
	n.count(func(s *Stats) { s.Enrollments++ })
	slog.Info("pod enrolled in ambient mode", "pod", rec.Key(), "containerID", rec.ContainerID, "netns", rec.Netns, "why", d.Why)
	return agentsocket.AnswerEnrolled, nil
}

// same tells whether the enrolled pod cur is rec enrolled as want: the
// same attachment in the same namespace with the same addresses, the
// same decision.
func same(cur, rec podstate.Record, want podstate.Enrollment, ips []netip.Addr) bool {
	have := *cur.Ambient
	have.IPs = nil
	return cur.ContainerID == rec.ContainerID && cur.Netns == rec.Netns && cur.NetnsIno == rec.NetnsIno &&
		slices.Equal(cur.IPs, rec.IPs) && reflect.DeepEqual(have, want) &&
		(len(ips) == 0 || slices.Equal(podAddrs(ips), cur.Ambient.IPs))
}

// enroll installs the pod's rules (in place of any it had), adds its
// addresses to the probe sets, records the enrollment, and hands the pod
// to ztunnel. A failure undoes what it did.
func (n *Node) enroll(ctx context.Context, name string, rec podstate.Record, e podstate.Enrollment, ips []netip.Addr, again bool) error {
	e.IPs = podAddrs(ips, rec.IPs)
	if err := netns.Enter(rec.Netns, func() error {
		if len(e.IPs) == 0 {
			addrs, err := apply.LocalAddrs()
			if err != nil {
				return fmt.Errorf("read the pod's addresses: %w", err)
			}
			for _, a := range addrs {
				if a.IsGlobalUnicast() {
					e.IPs = append(e.IPs, a)
				}
			}
		}
		return n.installInPod(ctx, e.Overrides)
	}); err != nil {
		return fmt.Errorf("install the in-pod rules: %w", err)
	}
	if err := n.probeAddrs(ctx, rec.UID, e.IPs, true); err != nil {
		n.undo(ctx, rec.Netns, e.IPs)
		return err
	}
	rec, err := n.o.Store.Update(name, false, func(r *podstate.Record) error {
		if r.NetnsIno != rec.NetnsIno {
			return podstate.ErrGone // another attachment's, since
		}
		r.Ambient = &e
		return nil
	})
	if err != nil {
		n.undo(ctx, rec.Netns, e.IPs)
		return err
	}
	n.setPod(name, rec, true)
	if err := n.zds.Add(ctx, workload(rec)); err != nil {
		n.count(func(s *Stats) { s.HandoffErrors++ })
		if again {
			// ztunnel gets the pod at its next snapshot; its rules are
			// in place.
			return fmt.Errorf("hand the pod to ztunnel: %w", err)
		}
		n.setPod(name, rec, false)
		_ = n.dropEnrollment(name, rec.NetnsIno)
		n.undo(ctx, rec.Netns, e.IPs)
		return fmt.Errorf("hand the pod to ztunnel: %w", err)
	}
	return nil
}

// undo removes the rules and probe addresses of a pod whose enrollment
// failed.
func (n *Node) undo(ctx context.Context, path string, ips []netip.Addr) {
	_ = netns.Enter(path, func() error { return n.removeInPod(ctx) })
	_ = n.probeAddrs(ctx, "", ips, false)
}

// unenroll takes an enrolled pod whose namespace is still there out of
// ambient mode: its rules removed, then forgotten.
func (n *Node) unenroll(ctx context.Context, name string, r podstate.Record) error {
	err := netns.Enter(r.Netns, func() error { return n.removeInPod(ctx) })
	if err != nil && !netns.IsGone(err) {
		return fmt.Errorf("remove the in-pod rules of pod %s: %w", r.Key(), err)
	}
	return n.forget(ctx, name, r)
}

// forget tells ztunnel the pod is gone, removes its probe addresses and
// its record's enrollment.
func (n *Node) forget(ctx context.Context, name string, r podstate.Record) error {
	if err := n.zds.Del(ctx, workload(r).UID); err != nil {
		// Not the pod's error: ztunnel's next snapshot leaves it out.
		n.count(func(s *Stats) { s.HandoffErrors++ })
		slog.Warn("could not tell ztunnel the pod is gone", "pod", r.Key(), "error", err)
	}
	if err := n.probeAddrs(ctx, r.UID, r.Ambient.IPs, false); err != nil {
		return err
	}
	if err := n.dropEnrollment(name, r.NetnsIno); err != nil {
		return err
	}
	n.setPod(name, r, false)
	n.count(func(s *Stats) { s.Unenrollments++ })
	return nil
}

// dropEnrollment removes the enrollment from the record named name, if
// it is still that of the namespace of nsfs inode ino; a record gone is
// not an error.
func (n *Node) dropEnrollment(name string, ino uint64) error {
	_, err := n.o.Store.Update(name, false, func(r *podstate.Record) error {
		if r.NetnsIno == ino {
			r.Ambient = nil
		}
		return nil
	})
	if errors.Is(err, podstate.ErrGone) {
		return nil
	}
	return err
}

// podAddrs are the first of the lists of addresses that has any, less
// loopback addresses (the loopback plugin's result).
func podAddrs(lists ...[]netip.Addr) []netip.Addr {
	for _, l := range lists {
		var out []netip.Addr
		for _, a := range l {
			if !a.IsLoopback() {
				out = append(out, a)
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}
