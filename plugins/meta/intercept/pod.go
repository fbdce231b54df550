package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/internal/cnierr"
)

// Per-pod interception on Kubernetes. containerd and CRI-O pass a pod's
// annotations to plugins that declare the io.kubernetes.cri.pod-annotations
// capability, and CNI_ARGS carries K8S_POD_NAMESPACE and K8S_POD_NAME: with
// either, the plugin runs for a Kubernetes pod and intercepts it only when
// it carries a sidecar. Without both (podman, `meshwire add`), every pod of
// the network is intercepted, as before.

const (
	capPodAnnotations = "io.kubernetes.cri.pod-annotations"

	// Istio's injector marks every pod it gave a sidecar with this one.
	annIstioStatus = "sidecar.istio.io/status"
	annIstioInject = "sidecar.istio.io/inject"
	// annMeshwire is for meshes that are not Istio: "true" intercepts the
	// pod, "false" never does.
	annMeshwire = "intercept.meshwire.io/enabled"
	// annIntoProxy says whether the eBPF fast path may feed the pod's
	// proxy ("true") or only its application ("false"). Without it, an
	// Istio sidecar (Envoy, which reads with recv/readv) is fed and any
	// other proxy is not: one that copies with splice() would stall.
	annIntoProxy = "fastpath.meshwire.io/into-proxy"
	// annMode picks the pod's interception mode: REDIRECT, TPROXY or
	// EBPF (no netfilter rule in the pod).
	annMode = "intercept.meshwire.io/mode"
	// Kubernetes' traffic shaping annotations (the bandwidth plugin's,
	// through containerd): a shaped pod is never paired with another
	// pod's sidecar by the fast path, whose bytes would skip the qdiscs.
	annIngressBandwidth = "kubernetes.io/ingress-bandwidth"
	annEgressBandwidth  = "kubernetes.io/egress-bandwidth"
)

// annotationFlags are the annotations Istio's injector turns into
// istio-iptables flags, with the flag each one sets; a pod's value goes on
// top of the plugin config's.
var annotationFlags = []struct{ annotation, flag string }{
	{"sidecar.istio.io/interceptionMode", "istio-inbound-interception-mode"},
	// meshwire's own mode annotation wins over Istio's, whose validation
	// knows no EBPF mode.
	{annMode, "istio-inbound-interception-mode"},
	{"traffic.sidecar.istio.io/includeOutboundIPRanges", "istio-service-cidr"},
	{"traffic.sidecar.istio.io/excludeOutboundIPRanges", "istio-service-exclude-cidr"},
	{"traffic.sidecar.istio.io/includeInboundPorts", "istio-inbound-ports"},
	{"traffic.sidecar.istio.io/excludeInboundPorts", "istio-local-exclude-ports"},
	{"traffic.sidecar.istio.io/includeOutboundPorts", "istio-outbound-ports"},
	{"traffic.sidecar.istio.io/excludeOutboundPorts", "istio-local-outbound-ports-exclude"},
	{"traffic.sidecar.istio.io/kubevirtInterfaces", "kube-virt-interfaces"},
	// The newer name wins over kubevirtInterfaces, as in istio-cni.
	{annRerouteVirtual, "kube-virt-interfaces"},
	{"traffic.sidecar.istio.io/excludeInterfaces", "istio-exclude-interfaces"},
}

// defaultExcludedNamespaces are never intercepted unless the config says
// otherwise (excludeNamespaces).
var defaultExcludedNamespaces = []string{"kube-system"}

// pod is what the runtime told the plugin about the pod.
type pod struct {
	Kubernetes  bool              // annotations capability present, or K8S_POD_NAME given
	Namespace   string            // K8S_POD_NAMESPACE
	Name        string            // K8S_POD_NAME
	UID         string            // K8S_POD_UID
	Annotations map[string]string // nil: the runtime passed none
}

// podFrom reads the pod from the annotations capability (nil when absent)
// and CNI_ARGS ("K=V;K=V").
func podFrom(annotations *map[string]string, cniArgs string) pod {
	p := pod{}
	if annotations != nil {
		p.Kubernetes = true
		p.Annotations = *annotations
	}
	for _, kv := range strings.Split(cniArgs, ";") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "K8S_POD_NAMESPACE":
			p.Namespace = v
		case "K8S_POD_UID":
			p.UID = v
		case "K8S_POD_NAME":
			p.Name = v
			p.Kubernetes = p.Kubernetes || v != ""
		}
	}
	return p
}

// decision is what the plugin does for one pod.
type decision struct {
	Intercept bool
	Why       string   // for the log and CHECK's messages
	Args      []string // flags from the pod's annotations, after the config's
	// Sources names what set each flag of Args (an annotation), so that
	// a bad value is reported as the pod's, not the config's.
	Sources map[string]string
	// InitContainer: the pod's own init container (istio-init) installs
	// the rules, so CHECK has no rules to judge.
	InitContainer bool
	// Fastpath is the pod's fast-path policy, for a meshed pod (its rules
	// installed here or by its init container); nil for any other.
	Fastpath *podpolicy.Policy
	// Pod is what the runtime told of the pod.
	Pod pod
}

// decide chooses whether to intercept the pod, and with which settings on
// top of the config's flags (cfgArgs); meshMeta is the config's
// proxyMetadata. A malformed meshwire annotation or proxy.istio.io/config
// is a config error naming it (the interception annotations are checked
// when parsed).
func decide(p pod, excluded []string, meshMeta map[string]string, cfgArgs []string) (decision, error) {
	if !p.Kubernetes {
		return decision{Intercept: true, Why: "not a Kubernetes pod: every pod of the network"}, nil
	}
	if slices.Contains(excluded, p.Namespace) {
		return decision{Why: fmt.Sprintf("namespace %q is excluded", p.Namespace)}, nil
	}
	if p.Annotations == nil {
		return decision{Why: "the runtime passed no pod annotations (capability " + capPodAnnotations + "): no way to tell a sidecar"}, nil
	}
	a := p.Annotations
	mw, set := a[annMeshwire]
	if set && mw != "true" && mw != "false" {
		return decision{}, cnierr.Field(annMeshwire, "annotation: want \"true\" or \"false\", got %q", mw)
	}
	into, intoSet := a[annIntoProxy]
	if intoSet && into != "true" && into != "false" {
		return decision{}, cnierr.Field(annIntoProxy, "annotation: want \"true\" or \"false\", got %q", into)
	}
	// policy is the fast path's for a meshed pod whose proxy is Envoy or
	// not: the annotation, else fed only when it is Envoy.
	shaped := a[annIngressBandwidth] != "" || a[annEgressBandwidth] != ""
	policy := func(envoy bool) *podpolicy.Policy {
		return &podpolicy.Policy{IntoProxy: into == "true" || (!intoSet && envoy), NoPeer: shaped}
	}
	switch {
	case mw == "false":
		return decision{Why: annMeshwire + " is false"}, nil
	case injectOff(a[annIstioInject]):
		return decision{Why: annIstioInject + " is false"}, nil
	case mw == "true":
		args, sources := annotationArgs(a)
		return decision{Intercept: true, Why: annMeshwire + " is true", Args: args, Sources: sources, Fastpath: policy(false)}, nil
	case a[annIstioStatus] != "":
		meta, err := proxyMetadata(meshMeta, a)
		if err != nil {
			return decision{}, err
		}
		if why, init := istioSkip(a, meta); why != "" {
			d := decision{Why: why, InitContainer: init}
			if init {
				d.Fastpath = policy(true)
			}
			return d, nil
		}
		args, sources := istioArgs(a, meta, cfgArgs)
		return decision{Intercept: true, Why: "the pod has an Istio sidecar (" + annIstioStatus + ")", Args: args, Sources: sources, Fastpath: policy(true)}, nil
	}
	return decision{Why: "no sidecar annotation"}, nil
}

// injectOff reads sidecar.istio.io/inject as istio-cni does: a boolean
// (strconv.ParseBool) that is false.
func injectOff(v string) bool {
	b, err := strconv.ParseBool(v)
	return err == nil && !b
}

// annotationArgs are the flags the pod's interception annotations set,
// with the annotation that set each.
func annotationArgs(a map[string]string) ([]string, map[string]string) {
	var args []string
	sources := map[string]string{}
	for _, af := range annotationFlags {
		if v, ok := a[af.annotation]; ok {
			args = append(args, fmt.Sprintf("--%s=%s", af.flag, v))
			sources[af.flag] = "annotation " + af.annotation
		}
	}
	return args, sources
}
