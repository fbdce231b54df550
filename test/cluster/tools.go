//go:build tools

// The packages this module builds, so that go mod tidy keeps their
// dependencies (see build.sh).
package cluster

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubernetes/test/e2e"
	_ "k8s.io/kubernetes/test/images/agnhost"
)
