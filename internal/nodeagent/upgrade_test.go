package nodeagent

import (
	"errors"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
)

func TestKeepWhileDaemonSet(t *testing.T) {
	now := metav1.Now()
	ds := func(deleting bool) *appsv1.DaemonSet {
		d := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "meshwire-node"}}
		if deleting {
			d.DeletionTimestamp = &now
			d.Finalizers = []string{"foregroundDeletion"}
		}
		return d
	}
	for _, tc := range []struct {
		name string
		c    *fake.Clientset
		want bool
	}{
		{"present: an update", fake.NewSimpleClientset(ds(false)), true},
		{"being deleted: an uninstall", fake.NewSimpleClientset(ds(true)), false},
		{"gone", fake.NewSimpleClientset(), false},
	} {
		c := tc.c
		if got := KeepWhileDaemonSet(func() (kubernetes.Interface, error) { return c, nil }, "kube-system", "meshwire-node", time.Second)(); got != tc.want {
			t.Errorf("%s: keep %v, want %v", tc.name, got, tc.want)
		}
	}
	noAPI := func() (kubernetes.Interface, error) { return nil, errors.New("no API server") }
	if KeepWhileDaemonSet(noAPI, "kube-system", "meshwire-node", time.Second)() {
		t.Error("no API access: keep, want the config change taken back")
	}
}
