package nodeagent

import (
	"context"
	"log/slog"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/meshwire/meshwire/internal/podwatch"
)

// KeepWhileDaemonSet is an installer.Options.KeepOnExit for the agent of
// the DaemonSet ns/name: keep the config change while the DaemonSet exists
// and is not being deleted (a rolling update, or the agent's pod deleted:
// the DaemonSet starts the next agent at once, and a pod created meanwhile
// still gets the chained plugin, which needs no agent); take it back when
// the DaemonSet is gone or going (an uninstall), or when the API server
// does not answer within timeout. istio-cni's node agent decides the same
// way in ambient mode (ShouldStopCleanup). The client is made when the
// agent stops (nil: the pod's own service account's, in-cluster), so
// that the flags are checked without an API server.
func KeepWhileDaemonSet(client func() (kubernetes.Interface, error), ns, name string, timeout time.Duration) func() bool {
	if client == nil {
		client = func() (kubernetes.Interface, error) { return podwatch.Client("") }
	}
	return func() bool {
		c, err := client()
		if err != nil {
			slog.Info("stopping: no API access to read the DaemonSet; taking the config change back", "daemonset", ns+"/"+name, "error", err)
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		ds, err := c.AppsV1().DaemonSets(ns).Get(ctx, name, metav1.GetOptions{})
		switch {
		case err != nil:
			slog.Info("stopping: the DaemonSet could not be read; taking the config change back", "daemonset", ns+"/"+name, "error", err)
			return false
		case ds.DeletionTimestamp != nil:
			slog.Info("stopping: the DaemonSet is being deleted; taking the config change back", "daemonset", ns+"/"+name)
			return false
		}
		slog.Info("stopping while the DaemonSet stays (an update or a restart): keeping the config change for the next agent", "daemonset", ns+"/"+name)
		return true
	}
}
