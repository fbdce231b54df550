package podwatch

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/meshwire/meshwire/internal/ambient"
)

const node = "node-a"

// cluster is a fake API server with a Watcher on it and the calls it made.
type cluster struct {
	t *testing.T
	c *fake.Clientset
	w *Watcher

	mu    sync.Mutex
	calls []string // the UIDs changed was called with
}

// start starts a Watcher on a fake API server that holds objs, and
// returns once the Watcher watches (the fake has no resource versions:
// an object created between its list and its watch would be lost).
func start(t *testing.T, objs ...runtime.Object) *cluster {
	t.Helper()
	k := &cluster{t: t, c: fake.NewClientset(objs...)}
	watching := make(chan string, 2)
	k.c.PrependWatchReactor("*", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := k.c.Tracker().Watch(a.GetResource(), a.GetNamespace())
		if err == nil {
			watching <- a.GetResource().Resource
		}
		return err == nil, w, err
	})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	var running atomic.Int32
	var concurrent atomic.Bool
	w, err := Start(ctx, k.c, node, func(uid string) {
		if running.Add(1) > 1 {
			concurrent.Store(true)
		}
		defer running.Add(-1)
		time.Sleep(time.Millisecond) // give a concurrent call the time to show
		k.mu.Lock()
		k.calls = append(k.calls, uid)
		k.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	k.w = w
	for range 2 {
		select {
		case <-watching:
		case <-time.After(10 * time.Second):
			t.Fatal("the informers do not watch")
		}
	}
	t.Cleanup(func() {
		if concurrent.Load() {
			t.Error("changed was called concurrently")
		}
	})
	return k
}

// eventually waits until cond holds.
func (k *cluster) eventually(what string, cond func() bool) {
	k.t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			k.t.Fatalf("timed out waiting: %s", what)
		}
	}
}

// called waits for a call of changed for uid (since the last reset).
func (k *cluster) called(uid string) {
	k.t.Helper()
	k.eventually("changed("+uid+")", func() bool {
		k.mu.Lock()
		defer k.mu.Unlock()
		return slices.Contains(k.calls, uid)
	})
}

func (k *cluster) reset() {
	k.mu.Lock()
	k.calls = nil
	k.mu.Unlock()
}

// enrolled waits until the pod uid is known with that enrollment.
func (k *cluster) enrolled(uid string, want bool) APIPod {
	k.t.Helper()
	var p APIPod
	k.eventually("pod "+uid+" enrolled="+map[bool]string{true: "true", false: "false"}[want], func() bool {
		var ok bool
		p, ok = k.w.Pod(uid)
		return ok && p.Enrolled == want
	})
	return p
}

func namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func pod(ns, name, nodeName string, labels, annotations map[string]string, ips ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "-" + name), Labels: labels, Annotations: annotations},
		Spec:       corev1.PodSpec{NodeName: nodeName, ServiceAccountName: "sa-" + name},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	if len(ips) > 0 {
		p.Status.PodIP = ips[0]
	}
	return p
}

var ambientLabel = map[string]string{ambient.LabelDataplaneMode: ambient.DataplaneModeAmbient}

func (k *cluster) updateNamespace(name string, labels map[string]string) {
	k.t.Helper()
	if _, err := k.c.CoreV1().Namespaces().Update(context.Background(), namespace(name, labels), metav1.UpdateOptions{}); err != nil {
		k.t.Fatal(err)
	}
}

func (k *cluster) createPod(p *corev1.Pod) {
	k.t.Helper()
	if _, err := k.c.CoreV1().Pods(p.Namespace).Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
		k.t.Fatal(err)
	}
}

// TestPodLabeled: a pod labeled ambient in a plain namespace, there at
// the start, is enrolled, and reported with everything Pod carries.
func TestPodLabeled(t *testing.T) {
	p := pod("apps", "web", node, ambientLabel, map[string]string{ambient.AnnotationDNSCapture: "false"}, "10.0.0.5", "fd00::5")
	k := start(t, namespace("apps", nil), p)
	k.called("apps-web")
	got := k.enrolled("apps-web", true)
	want := APIPod{
		UID: "apps-web", Name: "web", Namespace: "apps", ServiceAccount: "sa-web",
		IPs:      []netip.Addr{netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("fd00::5")},
		Enrolled: true, Overrides: ambient.Overrides{DNS: ambient.DNSOff},
	}
	if got.UID != want.UID || got.Name != want.Name || got.Namespace != want.Namespace || got.ServiceAccount != want.ServiceAccount ||
		!slices.Equal(got.IPs, want.IPs) || got.Overrides.DNS != ambient.DNSOff || got.OverridesErr != nil || got.Terminating || got.Why == "" {
		t.Errorf("Pod = %+v, want %+v", got, want)
	}
	if pods := k.w.Pods(); len(pods) != 1 || pods[0].UID != "apps-web" {
		t.Errorf("Pods() = %+v", pods)
	}
}

// TestNamespaceLabeledLater: labeling the namespace calls back for each
// of its pods here and enrolls them; removing the label unenrolls them;
// other namespaces' pods get no call.
func TestNamespaceLabeledLater(t *testing.T) {
	k := start(t, namespace("apps", nil), namespace("other", nil),
		pod("apps", "a", node, nil, nil, "10.0.0.1"),
		pod("apps", "b", node, nil, nil, "10.0.0.2"),
		pod("other", "c", node, nil, nil, "10.0.0.3"))
	for _, uid := range []string{"apps-a", "apps-b", "other-c"} {
		k.called(uid)
		k.enrolled(uid, false)
	}

	k.reset()
	k.updateNamespace("apps", ambientLabel)
	k.called("apps-a")
	k.called("apps-b")
	if p := k.enrolled("apps-a", true); p.Why == "" {
		t.Error("no reason given")
	}
	k.enrolled("apps-b", true)

	k.updateNamespace("apps", map[string]string{"team": "x"})
	k.eventually("both unenrolled", func() bool {
		a, _ := k.w.Pod("apps-a")
		b, _ := k.w.Pod("apps-b")
		return !a.Enrolled && !b.Enrolled
	})

	k.mu.Lock()
	defer k.mu.Unlock()
	if slices.Contains(k.calls, "other-c") {
		t.Errorf("a change of namespace apps called back for a pod of namespace other: %q", k.calls)
	}
}

// TestNamespaceAfterItsPod: a pod whose namespace is not known yet is
// not enrolled by it; when the namespace comes, its pods are called
// back for.
func TestNamespaceAfterItsPod(t *testing.T) {
	k := start(t, pod("late", "a", node, nil, nil, "10.0.0.1"))
	k.called("late-a")
	if p := k.enrolled("late-a", false); !strings.Contains(p.Why, "not known") {
		t.Errorf("Why = %q, want the namespace not known", p.Why)
	}
	k.reset()
	if _, err := k.c.CoreV1().Namespaces().Create(context.Background(), namespace("late", ambientLabel), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.called("late-a")
	k.enrolled("late-a", true)
}

// TestNamespaceLabelOptOut: in an ambient namespace, a pod created with
// istio.io/dataplane-mode=none is not enrolled, and relabeling it enrolls
// it (an update calls back).
func TestNamespaceLabelOptOut(t *testing.T) {
	k := start(t, namespace("apps", ambientLabel))
	p := pod("apps", "a", node, map[string]string{ambient.LabelDataplaneMode: ambient.DataplaneModeNone}, nil, "10.0.0.1")
	k.createPod(p)
	k.called("apps-a")
	k.enrolled("apps-a", false)

	k.reset()
	p.Labels = nil
	if _, err := k.c.CoreV1().Pods("apps").Update(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.called("apps-a")
	k.enrolled("apps-a", true)
}

// TestOtherNodeIgnored: a pod of another node is neither reported nor
// called back for, even from a server that ignores the field selector
// (as the fake does).
func TestOtherNodeIgnored(t *testing.T) {
	k := start(t, namespace("apps", ambientLabel))
	k.createPod(pod("apps", "there", "node-b", nil, nil, "10.0.1.1"))
	k.createPod(pod("apps", "here", node, nil, nil, "10.0.0.1"))
	k.called("apps-here")
	k.enrolled("apps-here", true)
	if _, ok := k.w.Pod("apps-there"); ok {
		t.Error("a pod of another node is reported")
	}
	if pods := k.w.Pods(); len(pods) != 1 {
		t.Errorf("Pods() = %+v, want the one pod of %s", pods, node)
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if slices.Contains(k.calls, "apps-there") {
		t.Error("called back for a pod of another node")
	}
}

// TestSidecarPodNotEnrolled: a pod with the injector's status annotation
// stays out, even labeled ambient in an ambient namespace; a bad override
// is reported with the annotation's name.
func TestSidecarPodNotEnrolled(t *testing.T) {
	k := start(t, namespace("apps", ambientLabel),
		pod("apps", "sc", node, ambientLabel, map[string]string{ambient.AnnotationSidecarStatus: "{}", ambient.AnnotationBypassInbound: "maybe"}))
	k.called("apps-sc")
	p := k.enrolled("apps-sc", false)
	if p.OverridesErr == nil {
		t.Error("the bad bypass-inbound-capture value is not reported")
	}
}

// TestDeletedPodGone: a deleted pod is called back for and then gone.
func TestDeletedPodGone(t *testing.T) {
	k := start(t, namespace("apps", ambientLabel), pod("apps", "a", node, nil, nil, "10.0.0.1"))
	k.called("apps-a")
	k.enrolled("apps-a", true)
	k.reset()
	if err := k.c.CoreV1().Pods("apps").Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	k.called("apps-a")
	// The call comes after the cache has dropped the pod.
	if _, ok := k.w.Pod("apps-a"); ok {
		t.Error("the deleted pod is still reported")
	}
	if pods := k.w.Pods(); len(pods) != 0 {
		t.Errorf("Pods() = %+v", pods)
	}
}

// TestTerminalPodKeepsItsIPs: a pod whose phase turns Succeeded is
// Terminating and, when its last status has no addresses
// (kubernetes/kubernetes#125370), keeps the ones it had.
func TestTerminalPodKeepsItsIPs(t *testing.T) {
	p := pod("apps", "job", node, nil, nil, "10.0.0.9")
	k := start(t, namespace("apps", ambientLabel), p)
	k.called("apps-job")
	k.enrolled("apps-job", true)
	k.reset()
	p.Status = corev1.PodStatus{Phase: corev1.PodSucceeded}
	if _, err := k.c.CoreV1().Pods("apps").UpdateStatus(context.Background(), p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	k.called("apps-job")
	var got APIPod
	k.eventually("Terminating", func() bool {
		got, _ = k.w.Pod("apps-job")
		return got.Terminating
	})
	if !slices.Equal(got.IPs, []netip.Addr{netip.MustParseAddr("10.0.0.9")}) {
		t.Errorf("Pod = %+v, want its last address", got)
	}
}

// TestNamespaceDeletedKeepsEnrollment: while a deleted namespace's pods
// are still here, they keep the enrollment its labels gave them (Istio
// leaves them alone until they go).
func TestNamespaceDeletedKeepsEnrollment(t *testing.T) {
	k := start(t, namespace("apps", ambientLabel), pod("apps", "a", node, nil, nil, "10.0.0.1"))
	k.enrolled("apps-a", true)
	if err := k.c.CoreV1().Namespaces().Delete(context.Background(), "apps", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually("the namespace gone from the cache", func() bool {
		_, ok, _ := k.w.namespaces.GetIndexer().GetByKey("apps")
		return !ok
	})
	k.eventually("its labels kept", func() bool {
		_, known := k.w.namespaceLabels("apps")
		return known
	})
	if p, _ := k.w.Pod("apps-a"); !p.Enrolled {
		t.Errorf("Pod = %+v, want still enrolled", p)
	}
	if err := k.c.CoreV1().Pods("apps").Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	k.eventually("the labels forgotten with the last pod", func() bool {
		_, known := k.w.namespaceLabels("apps")
		return !known
	})
}

// TestStartTimesOut: a server that never answers the list is an error
// after SyncTimeout, naming what could not be listed.
func TestStartTimesOut(t *testing.T) {
	c := fake.NewClientset()
	c.PrependReactor("list", "namespaces", func(k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, context.DeadlineExceeded
	})
	defer func(d time.Duration) { SyncTimeout = d }(SyncTimeout)
	SyncTimeout = 200 * time.Millisecond
	_, err := Start(context.Background(), c, node, func(string) {})
	if err == nil {
		t.Fatal("Start returned without its caches")
	}
	t.Log(err)
}

func TestStartNeedsANode(t *testing.T) {
	if _, err := Start(context.Background(), fake.NewClientset(), "", func(string) {}); err == nil {
		t.Fatal("no error without a node name")
	}
}

// TestContainerIDs: the ids of every container in the pod's status, init
// and ephemeral too, without the runtime's prefix; one not started yet
// has none.
func TestContainerIDs(t *testing.T) {
	p := pod("shop", "web", node, nil, nil)
	p.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "init", ContainerID: "containerd://i1"}}
	p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "web", ContainerID: "containerd://c1"}, {Name: "waiting"}}
	p.Status.EphemeralContainerStatuses = []corev1.ContainerStatus{{Name: "debug", ContainerID: "cri-o://e1"}}
	if got := containerIDs(p); !slices.Equal(got, []string{"i1", "c1", "e1"}) {
		t.Fatalf("containerIDs: %v", got)
	}
}
