// Command podstart times pod start on the single-node cluster (cluster.sh
// podstart): it creates N pods at once, each a pause container with no
// probe, and measures from just before each pod's create request to the
// moment the API server shows it Ready (scheduling, the sandbox with its
// CNI ADD, the container), then deletes them and waits until they are gone
// (the CNI DEL). Rounds repeat it; the result is JSON for compare.
//
//	podstart run -kubeconfig F [-pods 30] [-rounds 3] [-out FILE]
//	podstart compare NAME=FILE[,FILE...] NAME=FILE[,FILE...]   # p50 and p99 side by side, as ratios of the first
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// Result is one run: the create-to-Ready time of every pod of every round,
// and how long each round's deletion took.
type Result struct {
	Pods    int       `json:"pods"`
	Rounds  int       `json:"rounds"`
	StartMS []float64 `json:"start_ms"`
	DeleteS []float64 `json:"delete_s"`
}

const namespace = "mwk-podstart"

// grace is the pods' termination grace period: pause exits on SIGTERM.
var grace = int64(1)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "run":
		err = run(os.Args[2:])
	case "compare":
		err = compare(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "podstart:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: podstart run -kubeconfig F [-pods N] [-rounds R] [-out FILE] | podstart compare NAME=FILE NAME=FILE")
	os.Exit(2)
}

func run(args []string) error {
	fs := flag.NewFlagSet("podstart run", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster")
	pods := fs.Int("pods", 30, "pods created at once per round")
	rounds := fs.Int("rounds", 3, "rounds")
	out := fs.String("out", "", "write the result here as JSON")
	image := fs.String("image", "registry.k8s.io/pause:3.10.1", "the pods' one container")
	_ = fs.Parse(args)
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 100, 200 // the client's own rate limit must not be what is timed
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	defer func() {
		_ = cs.CoreV1().Namespaces().Delete(ctx, namespace, metav1.DeleteOptions{})
	}()
	if err := waitServiceAccount(ctx, cs); err != nil {
		return err
	}
	res := Result{Pods: *pods, Rounds: *rounds}
	for r := 1; r <= *rounds; r++ {
		start, del, err := round(ctx, cs, r, *pods, *image)
		if err != nil {
			return fmt.Errorf("round %d: %w", r, err)
		}
		res.StartMS = append(res.StartMS, start...)
		res.DeleteS = append(res.DeleteS, del.Seconds())
		fmt.Printf("round %d: %d pods, create to Ready p50 %.0f ms, p99 %.0f ms; all deleted in %.1f s\n",
			r, *pods, percentile(start, 50), percentile(start, 99), del.Seconds())
	}
	fmt.Printf("all rounds: %d pods, create to Ready p50 %.0f ms, p99 %.0f ms\n", len(res.StartMS), percentile(res.StartMS, 50), percentile(res.StartMS, 99))
	if *out == "" {
		return nil
	}
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	return os.WriteFile(*out, b, 0o644)
}

// waitServiceAccount waits for the namespace's default service account,
// without which the API server refuses pods.
func waitServiceAccount(ctx context.Context, cs *kubernetes.Clientset) error {
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, err := cs.CoreV1().ServiceAccounts(namespace).Get(ctx, "default", metav1.GetOptions{})
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("service account default in %s: %w", namespace, err)
		}
	}
}

func round(ctx context.Context, cs *kubernetes.Clientset, r, n int, image string) ([]float64, time.Duration, error) {
	label := fmt.Sprintf("round-%d", r)
	sel := "podstart=" + label
	w, err := cs.CoreV1().Pods(namespace).Watch(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, 0, err
	}
	defer w.Stop()
	var mu sync.Mutex
	created := map[string]time.Time{}
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		name := fmt.Sprintf("ps-%d-%d", r, i)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"podstart": label}},
			Spec: corev1.PodSpec{
				TerminationGracePeriodSeconds: &grace,
				Containers: []corev1.Container{{
					Name: "pause", Image: image, ImagePullPolicy: corev1.PullIfNotPresent,
				}},
			},
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			mu.Lock()
			created[name] = time.Now()
			mu.Unlock()
			if _, err := cs.CoreV1().Pods(namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, 0, err
	}
	ready := map[string]time.Duration{}
	timeout := time.After(5 * time.Minute)
	for len(ready) < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				return nil, 0, fmt.Errorf("watch closed with %d of %d pods Ready", len(ready), n)
			}
			pod, isPod := ev.Object.(*corev1.Pod)
			if !isPod || ev.Type == watch.Deleted {
				continue
			}
			if _, seen := ready[pod.Name]; seen || !isReady(pod) {
				continue
			}
			mu.Lock()
			ready[pod.Name] = time.Since(created[pod.Name])
			mu.Unlock()
		case <-timeout:
			return nil, 0, fmt.Errorf("%d of %d pods Ready after 5 minutes", len(ready), n)
		}
	}
	var ms []float64
	for _, d := range ready {
		ms = append(ms, float64(d.Microseconds())/1000)
	}
	// A graceful deletion: the API server keeps each pod until kubelet
	// has stopped it, its sandbox with it (the CNI DEL), so that the next
	// round starts on an idle node.
	t0 := time.Now()
	if err := cs.CoreV1().Pods(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{LabelSelector: sel}); err != nil {
		return nil, 0, err
	}
	for deadline := time.Now().Add(5 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		l, err := cs.CoreV1().Pods(namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return nil, 0, err
		}
		if len(l.Items) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return nil, 0, fmt.Errorf("%d pods not gone 5 minutes after their deletion", len(l.Items))
		}
	}
	return ms, time.Since(t0), nil
}

func isReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// percentile is the nearest-rank percentile of xs.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.5) - 1
	return s[max(0, min(i, len(s)-1))]
}

func compare(args []string) error {
	if len(args) != 2 {
		usage()
	}
	var names []string
	var res []Result
	for _, a := range args {
		name, files, ok := strings.Cut(a, "=")
		if !ok {
			usage()
		}
		var all Result // every file's pods and rounds together
		for _, file := range strings.Split(files, ",") {
			b, err := os.ReadFile(file)
			if err != nil {
				return err
			}
			var r Result
			if err := json.Unmarshal(b, &r); err != nil {
				return fmt.Errorf("%s: %w", file, err)
			}
			all.Pods, all.Rounds = r.Pods, all.Rounds+r.Rounds
			all.StartMS, all.DeleteS = append(all.StartMS, r.StartMS...), append(all.DeleteS, r.DeleteS...)
		}
		names, res = append(names, name), append(res, all)
	}
	fmt.Printf("| pod start, create to Ready | %s | %s | %s / %s |\n|---|---|---|---|\n", names[0], names[1], names[0], names[1])
	for _, p := range []float64{50, 99} {
		a, b := percentile(res[0].StartMS, p), percentile(res[1].StartMS, p)
		fmt.Printf("| p%.0f (%d and %d pods) | %.0f ms | %.0f ms | %.2fx |\n", p, len(res[0].StartMS), len(res[1].StartMS), a, b, a/b)
	}
	a, b := percentile(res[0].DeleteS, 50), percentile(res[1].DeleteS, 50)
	fmt.Printf("| deletion of %d pods, median of %d and %d rounds | %.1f s | %.1f s | %.2fx |\n", res[0].Pods, len(res[0].DeleteS), len(res[1].DeleteS), a, b, a/b)
	return nil
}
