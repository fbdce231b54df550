package framework

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/restmapper"
	"k8s.io/client-go/tools/remotecommand"
)

// Apply creates or updates every object of a YAML stream (server-side
// apply, as kubectl apply --server-side does).
func (c *Cluster) Apply(ctx context.Context, manifest []byte) error {
	dc, err := discovery.NewDiscoveryClientForConfig(c.Config)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(c.Config)
	if err != nil {
		return err
	}
	dec := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(manifest), 4096)
	for {
		var obj unstructured.Unstructured
		if err := dec.Decode(&obj.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if len(obj.Object) == 0 {
			continue
		}
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			return fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := obj.GetNamespace()
			if ns == "" {
				ns = "default"
			}
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		b, err := obj.MarshalJSON()
		if err != nil {
			return err
		}
		force := true
		if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, b,
			metav1.PatchOptions{FieldManager: "meshwire-suites", Force: &force}); err != nil {
			return fmt.Errorf("%s %s: %w", gvk.Kind, obj.GetName(), err)
		}
	}
}

// Exec runs cmd in a container of a pod, as kubectl exec does; it returns
// stdout, and stderr in the error when the command fails.
func (c *Cluster) Exec(ctx context.Context, ns, pod, container string, cmd ...string) (string, error) {
	req := c.Client.CoreV1().RESTClient().Post().Resource("pods").Namespace(ns).Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{Container: container, Command: cmd, Stdout: true, Stderr: true}, scheme.ParameterCodec)
	ex, err := remotecommand.NewSPDYExecutor(c.Config, "POST", req.URL())
	if err != nil {
		return "", err
	}
	var stdout, stderr bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdout: &stdout, Stderr: &stderr})
	if err != nil {
		return stdout.String(), fmt.Errorf("exec %s in %s/%s: %w: %s", strings.Join(cmd, " "), ns, pod, err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Logs is a container's log (all of it).
func (c *Cluster) Logs(ctx context.Context, ns, pod, container string) (string, error) {
	b, err := c.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	return string(b), err
}

// Pods lists the pods of ns that match the label selector.
func (c *Cluster) Pods(ctx context.Context, ns, selector string) ([]corev1.Pod, error) {
	l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// Ready says whether the pod's Ready condition is true.
func Ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// WaitReady waits until want pods of ns match selector, none being
// deleted, all Ready; it returns them.
func (c *Cluster) WaitReady(ctx context.Context, ns, selector string, want int, within time.Duration) ([]corev1.Pod, error) {
	var pods []corev1.Pod
	err := Poll(within, func() error {
		all, err := c.Pods(ctx, ns, selector)
		if err != nil {
			return err
		}
		pods = pods[:0]
		for i := range all {
			if all[i].DeletionTimestamp != nil {
				continue
			}
			if !Ready(&all[i]) {
				return fmt.Errorf("%s/%s not Ready (%s)", ns, all[i].Name, all[i].Status.Phase)
			}
			pods = append(pods, all[i])
		}
		if len(pods) != want {
			return fmt.Errorf("%d pods match %q in %s, want %d", len(pods), selector, ns, want)
		}
		return nil
	})
	return pods, err
}

// DeleteNamespace deletes ns and waits until it is gone (its pods' CNI DEL
// done).
func (c *Cluster) DeleteNamespace(ctx context.Context, ns string, within time.Duration) error {
	err := c.Client.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return c.WaitNamespaceGone(ctx, ns, within)
}

// WaitNamespaceGone waits until ns does not exist (an earlier run's).
func (c *Cluster) WaitNamespaceGone(ctx context.Context, ns string, within time.Duration) error {
	return Poll(within, func() error {
		_, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("namespace %s still there", ns)
	})
}

// IPv6 is the first IPv6 address of addrs (a Service's ClusterIPs), or ""
// when it has none: on a single-stack cluster, or a SingleStack Service.
func IPv6(addrs []string) string {
	for _, a := range addrs {
		if ip, err := netip.ParseAddr(a); err == nil && ip.Is6() && !ip.Is4In6() {
			return a
		}
	}
	return ""
}

// PodIPv6 is the pod's IPv6 address, or "" when it has none.
func PodIPv6(p *corev1.Pod) string {
	var addrs []string
	for _, ip := range p.Status.PodIPs {
		addrs = append(addrs, ip.IP)
	}
	return IPv6(addrs)
}

// TimedLine is a line of a container's log with the time the runtime
// read it from the container.
type TimedLine struct {
	At   time.Time
	Text string
}

// TimedLogs is a container's log (all of it), each line with its time,
// as kubectl logs --timestamps prints them.
func (c *Cluster) TimedLogs(ctx context.Context, ns, pod, container string) ([]TimedLine, error) {
	b, err := c.Client.CoreV1().Pods(ns).GetLogs(pod, &corev1.PodLogOptions{Container: container, Timestamps: true}).DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	return ParseTimedLog(string(b))
}

// ParseTimedLog reads the lines of a log printed with --timestamps
// ("RFC3339Nano text"); a line without a time is an error.
func ParseTimedLog(s string) ([]TimedLine, error) {
	var out []TimedLine
	for i, l := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
		if l == "" {
			continue
		}
		ts, text, _ := strings.Cut(l, " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			return nil, fmt.Errorf("log line %d has no time: %q", i+1, l)
		}
		out = append(out, TimedLine{At: at, Text: text})
	}
	return out, nil
}
