// Package podwatch tells which pods of this node are enrolled in Istio's
// ambient mode, from the API server, as istio-cni's node agent does: it
// watches the node's pods and every namespace, and calls back for each pod
// whose enrollment or overrides may have changed.
//
// It is istio-cni's cni/pkg/nodeagent/informers.go without the reconcile:
// the pods of this node only (field selector spec.nodeName=<node>), all
// namespaces (their labels only), a pod looked at again on its add,
// update and delete and, when a namespace's ambient label changes (or the
// namespace appears), every pod of that namespace. The decisions are
// package ambient's (Enrolled, Overrides), which take plain maps.
package podwatch

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"

	"github.com/meshwire/meshwire/internal/ambient"
)

// Client is a client of the API server: with the kubeconfig file at
// kubeconfig, or "" for the pod's own service account (in-cluster).
func Client(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	if err != nil {
		if kubeconfig == "" {
			return nil, fmt.Errorf("in-cluster API access: %w", err)
		}
		return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
	}
	return kubernetes.NewForConfig(rest.AddUserAgent(cfg, "meshwire-node"))
}

// APIPod is a pod of this node as the API server shows it: what the node
// agent needs of it.
type APIPod struct {
	UID, Name, Namespace, ServiceAccount string
	// IPs are the pod's addresses (status.podIPs, or status.podIP), none
	// before the runtime's CNI ADD is reported. A Terminating pod whose
	// last status dropped them (kubernetes/kubernetes#125370) keeps the
	// ones it had, which the agent needs to take it out of the probe set.
	IPs []netip.Addr
	// Enrolled and Why are ambient.Enrolled's, from the pod's labels and
	// annotations and its namespace's labels.
	Enrolled bool
	Why      string
	// Overrides are ambient.Overrides of the pod's annotations; with
	// OverridesErr, the annotations it ignored or that cannot be
	// installed.
	Overrides    ambient.Overrides
	OverridesErr error
	// ContainerIDs are the runtime's ids of the pod's containers, init
	// and ephemeral ones too, as its status reports them (without the
	// "containerd://" prefix): how the agent finds the processes of a pod
	// that started before ambient mode was on (podproc.Find).
	ContainerIDs []string
	// Terminating: the pod's phase is Succeeded or Failed, its containers
	// are gone for good (Istio's CheckPodTerminal). Istio takes such a pod
	// out of the mesh whatever Enrolled says. (A pod being deleted but
	// still running, within its grace period, is not Terminating: its
	// traffic still needs ztunnel.)
	Terminating bool
}

// SyncTimeout bounds how long Start waits for the first list of pods and
// namespaces.
var SyncTimeout = time.Minute

const byUID = "uid"

// Watcher watches the pods of one node and all namespaces.
type Watcher struct {
	node       string
	pods       cache.SharedIndexInformer
	namespaces cache.SharedIndexInformer
	queue      *workqueue.Typed[string] // pod UIDs to call back for

	mu sync.Mutex
	// lastIPs are each pod's last addresses seen, for a terminal status
	// without them.
	lastIPs map[string][]netip.Addr
	// goneNS are the labels of deleted namespaces that still have pods
	// here: during a namespace's deletion its pods keep the enrollment
	// they had (Istio leaves them alone until they go).
	goneNS map[string]map[string]string
}

// Start watches the pods of node and all namespaces and returns once it
// has listed them (or with an error after SyncTimeout or when ctx ends).
// It calls changed, from one goroutine, for each pod whose enrollment or
// overrides may have changed: every pod at the start, a pod added,
// updated in its labels, annotations, addresses or phase, or deleted
// (Pod then reports it gone), and every pod of a namespace whose ambient
// label changed. Calls for one pod in quick succession may come as one.
// Everything stops when ctx ends.
func Start(ctx context.Context, c kubernetes.Interface, node string, changed func(uid string)) (*Watcher, error) {
	if node == "" {
		return nil, errors.New("podwatch: no node name (NODE_NAME, from the downward API's spec.nodeName)")
	}
	w := &Watcher{
		node: node,
		pods: coreinformers.NewFilteredPodInformer(c, metav1.NamespaceAll, 0,
			cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc, byUID: uidIndex},
			func(o *metav1.ListOptions) { o.FieldSelector = "spec.nodeName=" + node }),
		namespaces: coreinformers.NewNamespaceInformer(c, 0, cache.Indexers{}),
		queue:      workqueue.NewTyped[string](),
		lastIPs:    map[string][]netip.Addr{},
		goneNS:     map[string]map[string]string{},
	}
	if err := errors.Join(w.pods.SetTransform(trimPod), w.namespaces.SetTransform(trimNamespace)); err != nil {
		return nil, err
	}
	podsDelivered, err1 := w.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.podAdded,
		UpdateFunc: w.podUpdated,
		DeleteFunc: w.podDeleted,
	})
	namespacesDelivered, err2 := w.namespaces.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    w.namespaceAdded,
		UpdateFunc: w.namespaceUpdated,
		DeleteFunc: w.namespaceDeleted,
	})
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}

	ctx, cancel := context.WithCancel(ctx)
	go w.pods.RunWithContext(ctx)
	go w.namespaces.RunWithContext(ctx)
	syncCtx, stop := context.WithTimeout(ctx, SyncTimeout)
	defer stop()
	// Synced: the first lists are in the caches and their events handed
	// to the handlers, so that the first calls are queued (once each).
	if !cache.WaitForCacheSync(syncCtx.Done(), podsDelivered.HasSynced, namespacesDelivered.HasSynced) {
		cancel()
		w.queue.ShutDown()
		var missing []string
		if !podsDelivered.HasSynced() {
			missing = append(missing, "the pods of node "+node)
		}
		if !namespacesDelivered.HasSynced() {
			missing = append(missing, "the namespaces")
		}
		return nil, fmt.Errorf("podwatch: could not list %s in %v: %w", strings.Join(missing, " and "), SyncTimeout, context.Cause(syncCtx))
	}
	// The callbacks start once both caches hold the first lists, so that
	// every pod's namespace is known when its first call comes.
	go func() {
		<-ctx.Done()
		w.queue.ShutDown()
	}()
	go func() {
		defer cancel()
		for {
			uid, shutdown := w.queue.Get()
			if shutdown {
				return
			}
			changed(uid)
			w.queue.Done(uid)
		}
	}()
	return w, nil
}

// Pod is the pod of this node with that UID, if there is one.
func (w *Watcher) Pod(uid string) (APIPod, bool) {
	objs, err := w.pods.GetIndexer().ByIndex(byUID, uid)
	if err != nil {
		return APIPod{}, false
	}
	for _, o := range objs {
		if p := o.(*corev1.Pod); p.Spec.NodeName == w.node {
			return w.view(p), true
		}
	}
	return APIPod{}, false
}

// Pods are all the pods of this node, by namespace and name.
func (w *Watcher) Pods() []APIPod {
	var out []APIPod
	for _, o := range w.pods.GetStore().List() {
		if p := o.(*corev1.Pod); p.Spec.NodeName == w.node {
			out = append(out, w.view(p))
		}
	}
	slices.SortFunc(out, func(a, b APIPod) int {
		return strings.Compare(a.Namespace+"/"+a.Name, b.Namespace+"/"+b.Name)
	})
	return out
}

// view is a pod as an APIPod.
func (w *Watcher) view(p *corev1.Pod) APIPod {
	nsLabels, known := w.namespaceLabels(p.Namespace)
	enrolled, why := ambient.Enrolled(ambient.PodMeta{Labels: p.Labels, Annotations: p.Annotations, HostNetwork: p.Spec.HostNetwork}, nsLabels)
	if !known {
		why = "namespace " + p.Namespace + " not known; " + why
	}
	overrides, err := ambient.ParseOverrides(p.Annotations)
	v := APIPod{
		UID: string(p.UID), Name: p.Name, Namespace: p.Namespace, ServiceAccount: p.Spec.ServiceAccountName,
		IPs: podIPs(p), Enrolled: enrolled, Why: why, Overrides: overrides, OverridesErr: err,
		Terminating: terminal(p), ContainerIDs: containerIDs(p),
	}
	if len(v.IPs) == 0 && v.Terminating {
		w.mu.Lock()
		v.IPs = slices.Clone(w.lastIPs[v.UID])
		w.mu.Unlock()
	}
	return v
}

// containerIDs are the ids of p's containers in its status.
func containerIDs(p *corev1.Pod) []string {
	var out []string
	for _, statuses := range [][]corev1.ContainerStatus{p.Status.InitContainerStatuses, p.Status.ContainerStatuses, p.Status.EphemeralContainerStatuses} {
		for _, cs := range statuses {
			if _, id, ok := strings.Cut(cs.ContainerID, "://"); ok && id != "" {
				out = append(out, id)
			}
		}
	}
	return out
}

// namespaceLabels are the labels of the namespace called name, and
// whether it is known (in the cache, or deleted with pods still here).
func (w *Watcher) namespaceLabels(name string) (map[string]string, bool) {
	if o, ok, _ := w.namespaces.GetIndexer().GetByKey(name); ok {
		return o.(*corev1.Namespace).Labels, true
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	labels, ok := w.goneNS[name]
	return labels, ok
}

func (w *Watcher) podAdded(obj any) {
	if p, ok := obj.(*corev1.Pod); ok && p.Spec.NodeName == w.node {
		w.remember(p)
		w.queue.Add(string(p.UID))
	}
}

func (w *Watcher) podUpdated(oldObj, newObj any) {
	old, ok1 := oldObj.(*corev1.Pod)
	p, ok2 := newObj.(*corev1.Pod)
	if !ok1 || !ok2 || p.Spec.NodeName != w.node {
		return
	}
	w.remember(p)
	// Status updates that change nothing an APIPod holds (conditions,
	// container states) are many: no call for them.
	if maps.Equal(old.Labels, p.Labels) && maps.Equal(old.Annotations, p.Annotations) &&
		slices.Equal(podIPs(old), podIPs(p)) && terminal(old) == terminal(p) {
		return
	}
	w.queue.Add(string(p.UID))
}

func (w *Watcher) podDeleted(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*corev1.Pod)
	if !ok || p.Spec.NodeName != w.node {
		return
	}
	w.mu.Lock()
	delete(w.lastIPs, string(p.UID))
	if _, gone := w.goneNS[p.Namespace]; gone && !w.hasPods(p.Namespace) {
		delete(w.goneNS, p.Namespace)
	}
	w.mu.Unlock()
	w.queue.Add(string(p.UID))
}

// remember keeps the pod's addresses for a terminal status without them.
func (w *Watcher) remember(p *corev1.Pod) {
	if ips := podIPs(p); len(ips) > 0 {
		w.mu.Lock()
		w.lastIPs[string(p.UID)] = ips
		w.mu.Unlock()
	}
}

func (w *Watcher) namespaceAdded(obj any) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return
	}
	w.mu.Lock()
	delete(w.goneNS, ns.Name)
	w.mu.Unlock()
	// Istio looks at a namespace's pods when the namespace appears: its
	// pods may have come first.
	w.enqueueNamespace(ns.Name)
}

func (w *Watcher) namespaceUpdated(oldObj, newObj any) {
	old, ok1 := oldObj.(*corev1.Namespace)
	ns, ok2 := newObj.(*corev1.Namespace)
	// As Istio (reconcileNamespace): only when the labels' verdict changes.
	if ok1 && ok2 && ambient.NamespaceAmbient(old.Labels) != ambient.NamespaceAmbient(ns.Labels) {
		w.enqueueNamespace(ns.Name)
	}
}

func (w *Watcher) namespaceDeleted(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.hasPods(ns.Name) {
		w.goneNS[ns.Name] = ns.Labels
	}
}

// hasPods tells whether the namespace has pods here.
func (w *Watcher) hasPods(namespace string) bool {
	keys, err := w.pods.GetIndexer().IndexKeys(cache.NamespaceIndex, namespace)
	return err == nil && len(keys) > 0
}

func (w *Watcher) enqueueNamespace(name string) {
	objs, _ := w.pods.GetIndexer().ByIndex(cache.NamespaceIndex, name)
	for _, o := range objs {
		if p := o.(*corev1.Pod); p.Spec.NodeName == w.node {
			w.queue.Add(string(p.UID))
		}
	}
}

func uidIndex(obj any) ([]string, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("podwatch: %T has no object metadata", obj)
	}
	return []string{string(m.GetUID())}, nil
}

// trimPod drops what no one here reads and takes memory: the field
// managers' records.
func trimPod(obj any) (any, error) {
	if p, ok := obj.(*corev1.Pod); ok {
		p.ManagedFields = nil
	}
	return obj, nil
}

// trimNamespace keeps of a namespace its name and labels.
func trimNamespace(obj any) (any, error) {
	if ns, ok := obj.(*corev1.Namespace); ok {
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
			Name: ns.Name, UID: ns.UID, ResourceVersion: ns.ResourceVersion, Labels: ns.Labels,
		}}, nil
	}
	return obj, nil
}

// podIPs are the pod's addresses as Istio's GetPodIPsIfPresent reads
// them: status.podIPs, else status.podIP (an unparsable one is skipped).
func podIPs(p *corev1.Pod) []netip.Addr {
	var s []string
	for _, ip := range p.Status.PodIPs {
		s = append(s, ip.IP)
	}
	if len(s) == 0 && p.Status.PodIP != "" {
		s = []string{p.Status.PodIP}
	}
	var out []netip.Addr
	for _, ip := range s {
		if a, err := netip.ParseAddr(ip); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// terminal is Istio's CheckPodTerminal.
func terminal(p *corev1.Pod) bool {
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}
