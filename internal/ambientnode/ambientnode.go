// Package ambientnode enrolls the pods of a node in Istio's ambient mode,
// the job istio-cni's node agent does. For each enrolled pod it installs
// the in-pod rules (package ambient) and policy routing in the pod's
// network namespace, puts the pod's addresses in the probe sets of the
// host rule, and hands the namespace to the node's ztunnel; it undoes all
// three when the pod leaves ambient or goes. The pods' namespaces come
// from the intercept plugin's records (package podnetns); whether a pod is
// enrolled is the caller's to decide (Options.Decide: the API server's
// labels, or the pod's annotations). What it enrolled is kept on the node,
// so that a restarted agent knows its pods again.
package ambientnode

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"sync"

	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/podnetns"
	"github.com/meshwire/meshwire/internal/recordfile"
)

// StateDir is where the enrolled pods are kept, beside the agent's socket
// (podnetns.Socket), in the directory the DaemonSet mounts.
const StateDir = "/var/lib/cni/meshwire/ambient/enrolled"

// Enrollment is the decision for one pod.
type Enrollment struct {
	Enrolled bool
	Why      string // why (not), for logs and the plugin's answer
	// Pod is what the pod changes of the in-pod rules.
	Pod ambient.Pod
	// UID and ServiceAccount are what ztunnel is told of the pod, with
	// its names; UID is the record's when empty.
	UID, ServiceAccount string
	// IPs are the pod's addresses (the API server's), which the probe
	// sets hold; when none, the record's, else those of the pod's
	// namespace.
	IPs []netip.Addr
}

// Workload is one pod as ztunnel is told of it.
type Workload struct {
	UID, Name, Namespace, ServiceAccount string
	// Netns opens the pod's namespace, checked to be the pod's.
	Netns func() (*os.File, error)
}

// Ztunnel is the hand-off to the node's ztunnel.
type Ztunnel interface {
	// Add hands w to ztunnel and waits for its ack.
	Add(ctx context.Context, w Workload) error
	// Del tells ztunnel the pod is gone.
	Del(ctx context.Context, uid string) error
	// Connected tells whether a ztunnel is connected.
	Connected() bool
}

// Options are a Node's.
type Options struct {
	Config ambient.Config
	// Backend programs the in-pod rules and the host rule (the host's).
	Backend firewall.Backend
	// PodsDir holds the plugin's records (podnetns.Dir when empty), and
	// StateDir the enrolled pods (StateDir when empty).
	PodsDir, StateDir string
	// Decide decides for one pod's record; atAdd: at the pod's ADD (a
	// pod just created, which the API server's watch may not show yet).
	Decide  func(p podnetns.Pod, atAdd bool) Enrollment
	Ztunnel Ztunnel
	Logf    func(format string, a ...any)
}

// enrolled is what the node keeps of an enrolled pod.
type enrolled struct {
	Pod        podnetns.Pod `json:"pod"`
	Enrollment Enrollment   `json:"enrollment"`
	Backend    string       `json:"backend"`
	// IPs are the addresses put in the probe sets.
	IPs []netip.Addr `json:"ips"`
}

func (e enrolled) workload() Workload {
	uid := e.Enrollment.UID
	if uid == "" {
		uid = e.Pod.UID
	}
	return Workload{UID: uid, Name: e.Pod.Name, Namespace: e.Pod.Namespace, ServiceAccount: e.Enrollment.ServiceAccount, Netns: e.Pod.Open}
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
	o  Options
	mu sync.Mutex // held by each pod's act (Sync), ztunnel's ack waited for
	// pmu guards pods and stats, which Sync changes holding mu too: the
	// snapshot a connecting ztunnel asks for (Workloads) must not wait
	// for an act that waits for that ztunnel.
	pmu   sync.Mutex
	pods  map[string]enrolled // by record name
	stats Stats
}

// setPod keeps (or, with ok false, drops) an enrolled pod.
func (n *Node) setPod(name string, e enrolled, ok bool) {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	if ok {
		n.pods[name] = e
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

// New reads the pods the node enrolled before (a restart of the agent).
func New(o Options) (*Node, error) {
	if o.PodsDir == "" {
		o.PodsDir = podnetns.Dir
	}
	if o.StateDir == "" {
		o.StateDir = StateDir
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Decide == nil || o.Ztunnel == nil {
		return nil, errors.New("ambient mode needs a decision and a ztunnel hand-off")
	}
	if o.Config.ProbeSNAT == (ambient.Config{}).ProbeSNAT {
		o.Config.ProbeSNAT = ambient.DefaultProbeSNAT
	}
	if o.Config.ProbeSNATv6 == (ambient.Config{}).ProbeSNATv6 {
		o.Config.ProbeSNATv6 = ambient.DefaultProbeSNATv6
	}
	recs, bad, err := recordfile.ReadAll[enrolled](o.StateDir, "the enrolled pods")
	if err != nil {
		return nil, err
	}
	for _, name := range bad {
		_ = recordfile.Remove(o.StateDir, name, "a write of an enrolled pod cut short")
	}
	n := &Node{o: o, pods: map[string]enrolled{}}
	maps.Copy(n.pods, recs)
	return n, nil
}

// Workloads are the enrolled pods whose namespace is still theirs: the
// snapshot ztunnel is sent when it connects.
func (n *Node) Workloads() []Workload {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	out := make([]Workload, 0, len(n.pods))
	for _, e := range n.pods {
		if e.Pod.Check() == nil {
			out = append(out, e.workload())
		}
	}
	slices.SortFunc(out, func(a, b Workload) int { return cmp.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name) })
	return out
}

// Stats returns the node's counters.
func (n *Node) Stats() Stats {
	n.pmu.Lock()
	defer n.pmu.Unlock()
	s := n.stats
	s.Enrolled = len(n.pods)
	return s
}

// Reconcile acts on every pod: the records the plugin wrote, and the pods
// enrolled whose record is gone.
func (n *Node) Reconcile(ctx context.Context) error {
	recs, err := podnetns.List(n.o.PodsDir)
	if err != nil {
		return err
	}
	names := map[string]bool{}
	for name := range recs {
		names[name] = true
	}
	n.pmu.Lock()
	for name := range n.pods {
		names[name] = true
	}
	n.pmu.Unlock()
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(names)) {
		if _, err := n.Sync(ctx, name, false); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Sync acts on the pod of record name (podnetns.Pod.Record) and answers
// as the plugin's question expects. atAdd is the plugin's ADD: the pod's
// containers have not started, and an enrolled pod is not let start
// before ztunnel holds it (no ztunnel connected is an error).
func (n *Node) Sync(ctx context.Context, name string, atAdd bool) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	cur, was := n.pods[name]
	rec, ok, err := podnetns.Read(n.o.PodsDir, name)
	if err != nil {
		return "", err
	}
	if ok && rec.Check() != nil {
		// The pod's namespace went without a DEL: its record is the
		// agent's to collect.
		n.o.Logf("ambient: the namespace of pod %s is gone; forgetting the pod", rec.Key())
		_ = podnetns.Remove(n.o.PodsDir, rec.ContainerID, rec.IfName)
		ok = false
	}
	if !ok {
		if was && cur.Pod.Check() == nil {
			// DEL with the namespace still there (the runtime may ADD
			// the same sandbox again): its rules go too.
			return podnetns.AnswerNotEnrolled + ": the pod's DEL ran", n.unenroll(ctx, name, cur)
		}
		if was {
			return podnetns.AnswerNotEnrolled + ": the pod is gone", n.forget(ctx, name, cur)
		}
		return podnetns.AnswerNotEnrolled + ": no record of the pod", nil
	}
	e := n.o.Decide(rec, atAdd)
	if !e.Enrolled {
		if was {
			if err := n.unenroll(ctx, name, cur); err != nil {
				return "", err
			}
			n.o.Logf("ambient: pod %s left ambient mode: %s", rec.Key(), e.Why)
		}
		return podnetns.AnswerNotEnrolled + ": " + e.Why, nil
	}
	want := enrolled{Pod: rec, Enrollment: e, Backend: n.o.Backend.String()}
	if was && reflect.DeepEqual(cur.Pod, want.Pod) && reflect.DeepEqual(cur.Enrollment, want.Enrollment) && cur.Backend == want.Backend {
		return podnetns.AnswerEnrolled, nil
	}
	if atAdd && !n.o.Ztunnel.Connected() {
		return "", fmt.Errorf("pod %s is enrolled in ambient mode and no ztunnel is connected to the node agent", rec.Key())
	}
	if err := n.enroll(ctx, name, want, was); err != nil {
		n.count(func(s *Stats) { s.EnrollFailures++ })
		return "", fmt.Errorf("enroll pod %s in ambient mode: %w", rec.Key(), err)
	}
	n.count(func(s *Stats) { s.Enrollments++ })
	n.o.Logf("ambient: pod %s enrolled (%s)", rec.Key(), e.Why)
	return podnetns.AnswerEnrolled, nil
}

// enroll installs the pod's rules (in place of any it had), adds its
// addresses to the probe sets, keeps it, and hands it to ztunnel. A
// failure undoes what it did.
func (n *Node) enroll(ctx context.Context, name string, e enrolled, again bool) error {
	e.IPs = podAddrs(e.Enrollment.IPs, e.Pod.IPs)
	if err := netns.Enter(e.Pod.Netns, func() error {
		if len(e.IPs) == 0 {
			var err error
			if e.IPs, err = localAddrs(); err != nil {
				return err
			}
		}
		return n.installInPod(ctx, e.Enrollment.Pod)
	}); err != nil {
		return fmt.Errorf("install the in-pod rules: %w", err)
	}
	if err := n.probeAddrs(ctx, e, true); err != nil {
		n.undo(ctx, e)
		return err
	}
	if err := recordfile.Write(n.o.StateDir, name, "the enrolled pod", e); err != nil {
		n.undo(ctx, e)
		return err
	}
	n.setPod(name, e, true)
	if err := n.o.Ztunnel.Add(ctx, e.workload()); err != nil {
		n.count(func(s *Stats) { s.HandoffErrors++ })
		if again {
			// ztunnel gets the pod at its next snapshot; its rules are
			// in place.
			return fmt.Errorf("hand the pod to ztunnel: %w", err)
		}
		n.setPod(name, e, false)
		_ = recordfile.Remove(n.o.StateDir, name, "the enrolled pod")
		n.undo(ctx, e)
		return fmt.Errorf("hand the pod to ztunnel: %w", err)
	}
	return nil
}

// undo removes the rules and probe addresses of a pod whose enrollment
// failed.
func (n *Node) undo(ctx context.Context, e enrolled) {
	_ = netns.Enter(e.Pod.Netns, func() error { return n.removeInPod(ctx) })
	_ = n.probeAddrs(ctx, e, false)
}

// unenroll takes an enrolled pod whose namespace is still there out of
// ambient mode: its rules removed, then forgotten.
func (n *Node) unenroll(ctx context.Context, name string, e enrolled) error {
	err := netns.Enter(e.Pod.Netns, func() error { return n.removeInPod(ctx) })
	if err != nil && !netns.IsGone(err) {
		return fmt.Errorf("remove the in-pod rules of pod %s: %w", e.Pod.Key(), err)
	}
	return n.forget(ctx, name, e)
}

// forget tells ztunnel the pod is gone, removes its probe addresses and
// its record.
func (n *Node) forget(ctx context.Context, name string, e enrolled) error {
	if err := n.o.Ztunnel.Del(ctx, e.workload().UID); err != nil {
		// Not the pod's error: ztunnel's next snapshot leaves it out.
		n.count(func(s *Stats) { s.HandoffErrors++ })
		n.o.Logf("ambient: tell ztunnel pod %s is gone: %v", e.Pod.Key(), err)
	}
	if err := n.probeAddrs(ctx, e, false); err != nil {
		return err
	}
	if err := recordfile.Remove(n.o.StateDir, name, "the enrolled pod"); err != nil {
		return err
	}
	n.setPod(name, e, false)
	n.count(func(s *Stats) { s.Unenrollments++ })
	return nil
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

// localAddrs are the global unicast addresses of the calling thread's
// namespace.
func localAddrs() ([]netip.Addr, error) {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("read the pod's addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap().IsGlobalUnicast() {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}
