package framework

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
)

// PodStartResult is one pod-start run: the create-to-Ready time of every
// pod of every round, how long each round's deletion took, and each
// round's window.
type PodStartResult struct {
	Pods    int       `json:"pods"`
	Rounds  int       `json:"rounds"`
	StartMS []float64 `json:"start_ms"`
	DeleteS []float64 `json:"delete_s"`
	Windows []Window  `json:"windows,omitempty"`
	// CPU is each round's CPU time, from the creates to the last pod
	// Ready, in seconds by component (SampleCPU).
	CPU []map[string]float64 `json:"cpu_s,omitempty"`
}

// Window is a round's pod start: from just before its first create
// request to the moment the last of its pods was seen Ready. What the
// node and the API server did for the round's pod starts (CNI ADDs, API
// requests) lies in it.
type Window struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
}

// Contains says whether t lies in w (both ends included).
func (w Window) Contains(t time.Time) bool { return !t.Before(w.From) && !t.After(w.To) }

// InWindows says whether t lies in one of ws.
func InWindows(ws []Window, t time.Time) bool {
	for _, w := range ws {
		if w.Contains(t) {
			return true
		}
	}
	return false
}

// Add puts r's pods and rounds together with p's.
func (p PodStartResult) Add(r PodStartResult) PodStartResult {
	return PodStartResult{Pods: r.Pods, Rounds: p.Rounds + r.Rounds,
		StartMS: append(slices.Clone(p.StartMS), r.StartMS...), DeleteS: append(slices.Clone(p.DeleteS), r.DeleteS...),
		Windows: append(slices.Clone(p.Windows), r.Windows...), CPU: append(slices.Clone(p.CPU), r.CPU...)}
}

// PausePod is the pod PodStart starts by default: one pause container of
// image, no probe.
func PausePod(image string) *corev1.Pod {
	return &corev1.Pod{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: "pause", Image: image, ImagePullPolicy: corev1.PullIfNotPresent}},
	}}
}

// PodStartNS is the namespace pod-start runs use.
const PodStartNS = "mwk-podstart"

// PodStart times pod start: pods pods created at once, each a pause
// container with no probe, from just before each pod's create request to
// the moment the API server shows it Ready (scheduling, the sandbox with
// its CNI ADD, the container); then they are deleted and waited for until
// gone (the CNI DEL), so that the next round starts on idle nodes. logf
// gets a line per round.
func PodStart(ctx context.Context, cs kubernetes.Interface, pods, rounds int, image string, logf func(string, ...any)) (PodStartResult, error) {
	return PodStartOf(ctx, cs, pods, rounds, PausePod(image), logf)
}

// PodStartOf is PodStart with pods made from tmpl (its spec, labels and
// annotations; the name, the namespace and the grace period are
// PodStart's).
func PodStartOf(ctx context.Context, cs kubernetes.Interface, pods, rounds int, tmpl *corev1.Pod, logf func(string, ...any)) (PodStartResult, error) {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: PodStartNS}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return PodStartResult{}, err
	}
	defer func() { _ = cs.CoreV1().Namespaces().Delete(ctx, PodStartNS, metav1.DeleteOptions{}) }()
	// The API server refuses pods until the namespace's default service
	// account exists.
	if err := Poll(time.Minute, func() error {
		_, err := cs.CoreV1().ServiceAccounts(PodStartNS).Get(ctx, "default", metav1.GetOptions{})
		return err
	}); err != nil {
		return PodStartResult{}, err
	}
	res := PodStartResult{Pods: pods, Rounds: rounds}
	for r := 1; r <= rounds; r++ {
		start, win, cpu, del, err := podStartRound(ctx, cs, r, pods, tmpl)
		if err != nil {
			return res, fmt.Errorf("round %d: %w", r, err)
		}
		res.StartMS = append(res.StartMS, start...)
		res.Windows = append(res.Windows, win)
		res.DeleteS = append(res.DeleteS, del.Seconds())
		res.CPU = append(res.CPU, cpu)
		logf("round %d: %d pods, create to Ready p50 %.0f ms, p99 %.0f ms; all deleted in %.1f s; CPU until the last Ready: %s",
			r, pods, Percentile(start, 50), Percentile(start, 99), del.Seconds(), CPULine(cpu))
	}
	return res, nil
}

// maxReopen bounds how often a round's watch may be opened again.
const maxReopen = 5

// grace is the pods' termination grace period: pause exits on SIGTERM.
var grace = int64(1)

func podStartRound(ctx context.Context, cs kubernetes.Interface, r, n int, tmpl *corev1.Pod) ([]float64, Window, map[string]float64, time.Duration, error) {
	label := fmt.Sprintf("round-%d", r)
	sel := "podstart=" + label
	var win Window
	w, err := cs.CoreV1().Pods(PodStartNS).Watch(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, win, nil, 0, err
	}
	defer w.Stop()
	var mu sync.Mutex
	created := map[string]time.Time{}
	errs := make(chan error, n)
	var wg sync.WaitGroup
	cpu0 := SampleCPU()
	win.From = time.Now()
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("ps-%d-%d", r, i)
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: PodStartNS,
			Labels: map[string]string{}, Annotations: tmpl.Annotations}, Spec: *tmpl.Spec.DeepCopy()}
		for k, v := range tmpl.Labels {
			pod.Labels[k] = v
		}
		pod.Labels["podstart"] = label
		pod.Spec.TerminationGracePeriodSeconds = &grace
		wg.Add(1)
		go func() {
			defer wg.Done()
			mu.Lock()
			created[name] = time.Now()
			mu.Unlock()
			if _, err := cs.CoreV1().Pods(PodStartNS).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, win, nil, 0, err
	}
	ready := map[string]time.Duration{}
	seen := func(pod *corev1.Pod) {
		if _, ok := ready[pod.Name]; ok || !Ready(pod) {
			return
		}
		mu.Lock()
		ready[pod.Name] = time.Since(created[pod.Name])
		win.To = time.Now()
		mu.Unlock()
	}
	timeout := time.After(5 * time.Minute)
	reopened := 0
	for len(ready) < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				// The API server may end a watch at any time (seen once
				// on the reference's cluster, in round 2): list what
				// happened meanwhile and watch again from there. Pods the
				// list finds Ready are timed at the list, a little late.
				if reopened++; reopened > maxReopen {
					return nil, win, nil, 0, fmt.Errorf("watch closed %d times, %d of %d pods Ready", reopened, len(ready), n)
				}
				l, err := cs.CoreV1().Pods(PodStartNS).List(ctx, metav1.ListOptions{LabelSelector: sel})
				if err != nil {
					return nil, win, nil, 0, fmt.Errorf("watch closed, then: %w", err)
				}
				for i := range l.Items {
					seen(&l.Items[i])
				}
				if w, err = cs.CoreV1().Pods(PodStartNS).Watch(ctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: l.ResourceVersion}); err != nil {
					return nil, win, nil, 0, fmt.Errorf("watch closed, then: %w", err)
				}
				defer w.Stop()
				continue
			}
			if pod, isPod := ev.Object.(*corev1.Pod); isPod && ev.Type != watch.Deleted {
				seen(pod)
			}
		case <-timeout:
			return nil, win, nil, 0, fmt.Errorf("%d of %d pods Ready after 5 minutes", len(ready), n)
		}
	}
	if reopened > 0 {
		fmt.Fprintf(os.Stderr, "pod start, round %d: the watch was opened again %d time(s)\n", r, reopened)
	}
	cpu := CPUDelta(cpu0, SampleCPU())
	var ms []float64
	for _, d := range ready {
		ms = append(ms, float64(d.Microseconds())/1000)
	}
	// A graceful deletion: the API server keeps each pod until kubelet
	// has stopped it, its sandbox with it (the CNI DEL).
	t0 := time.Now()
	if err := cs.CoreV1().Pods(PodStartNS).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: sel}); err != nil {
		return nil, win, cpu, 0, err
	}
	err = Poll(5*time.Minute, func() error {
		l, err := cs.CoreV1().Pods(PodStartNS).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return err
		}
		if len(l.Items) > 0 {
			return fmt.Errorf("%d pods not gone after their deletion", len(l.Items))
		}
		return nil
	})
	return ms, win, cpu, time.Since(t0), err
}

// Percentile is the nearest-rank percentile of xs.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

// PodStartTarget is a stated bound on a ratio of two networks' pod start
// (the run's over the control's) at a percentile.
type PodStartTarget struct {
	Percentile float64
	Max        float64
}

// ComparePodStart writes the table of a against b (p50, p99, deletion)
// and judges each target: the error lists the misses.
func ComparePodStart(aName string, a PodStartResult, bName string, b PodStartResult, targets []PodStartTarget) (string, error) {
	table := fmt.Sprintf("| pod start, create to Ready | %s | %s | %s / %s | target |\n|---|---|---|---|---|\n", aName, bName, aName, bName)
	var misses []string
	for _, tg := range targets {
		x, y := Percentile(a.StartMS, tg.Percentile), Percentile(b.StartMS, tg.Percentile)
		ratio := x / y
		met := "met"
		if y == 0 || ratio > tg.Max {
			met = "**missed**"
			misses = append(misses, fmt.Sprintf("p%.0f %.2fx > %.2fx", tg.Percentile, ratio, tg.Max))
		}
		table += fmt.Sprintf("| p%.0f (%d and %d pods) | %.0f ms | %.0f ms | %.2fx | <= %.2fx, %s |\n",
			tg.Percentile, len(a.StartMS), len(b.StartMS), x, y, ratio, tg.Max, met)
	}
	x, y := Percentile(a.DeleteS, 50), Percentile(b.DeleteS, 50)
	table += fmt.Sprintf("| deletion of %d pods, median of %d and %d rounds | %.1f s | %.1f s | %.2fx | (not judged) |\n", a.Pods, len(a.DeleteS), len(b.DeleteS), x, y, x/y)
	if len(a.StartMS) == 0 || len(b.StartMS) == 0 {
		return table, fmt.Errorf("no pod start measured (%d and %d pods)", len(a.StartMS), len(b.StartMS))
	}
	if len(misses) > 0 {
		return table, fmt.Errorf("missed: %v", misses)
	}
	return table, nil
}

// CompareTimes writes the table of the samples a against b (in ms) at each
// target's percentile, what naming them, and judges each target: the
// error lists the misses; no sample on either side is an error too.
func CompareTimes(what, aName string, a []float64, bName string, b []float64, targets []PodStartTarget) (string, error) {
	table := fmt.Sprintf("| %s | %s | %s | %s / %s | target |\n|---|---|---|---|---|\n", what, aName, bName, aName, bName)
	var misses []string
	for _, tg := range targets {
		x, y := Percentile(a, tg.Percentile), Percentile(b, tg.Percentile)
		ratio := x / y
		met := "met"
		if y == 0 || ratio > tg.Max {
			met = "**missed**"
			misses = append(misses, fmt.Sprintf("p%.0f %.2fx > %.2fx", tg.Percentile, ratio, tg.Max))
		}
		table += fmt.Sprintf("| p%.0f (%d and %d samples) | %s ms | %s ms | %.2fx | <= %.2fx, %s |\n",
			tg.Percentile, len(a), len(b), msString(x), msString(y), ratio, tg.Max, met)
	}
	if len(a) == 0 || len(b) == 0 {
		return table, fmt.Errorf("nothing measured (%d and %d samples)", len(a), len(b))
	}
	if len(misses) > 0 {
		return table, fmt.Errorf("missed: %v", misses)
	}
	return table, nil
}

// msString is ms with a precision that suits it: 3 digits below 10 ms,
// none above 100.
func msString(ms float64) string {
	switch {
	case ms < 10:
		return fmt.Sprintf("%.2f", ms)
	case ms < 100:
		return fmt.Sprintf("%.1f", ms)
	}
	return fmt.Sprintf("%.0f", ms)
}
