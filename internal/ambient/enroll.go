package ambient

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/meshwire/meshwire/internal/link"
)

// Which pods are enrolled, and what each changes of the in-pod rules: the
// decisions istio-cni's node agent takes from a pod's labels and
// annotations and its namespace's labels. These functions take plain maps
// so that the API server's types stay in package podwatch.

// The labels and annotations Istio reads (istio.io/api's label and
// annotation packages, pkg/config/constants).
const (
	// LabelDataplaneMode, on a pod or its namespace, asks for ambient
	// (DataplaneModeAmbient); DataplaneModeNone on a pod opts it out of
	// its namespace's.
	LabelDataplaneMode   = "istio.io/dataplane-mode"
	DataplaneModeAmbient = "ambient"
	DataplaneModeNone    = "none"

	// AnnotationSidecarStatus is the sidecar injector's mark: a pod with
	// a sidecar is never enrolled.
	AnnotationSidecarStatus = "sidecar.istio.io/status"
	// AnnotationRedirection is the status annotation istio-cni writes on
	// an enrolled pod ("enabled", "pending"). It is not an opt-out: the
	// value "disabled" stopped meaning one in Istio 1.23 (release note
	// 50804); the label DataplaneModeNone replaced it.
	AnnotationRedirection = "ambient.istio.io/redirection"

	// The pod's overrides of the in-pod rules (Overrides).
	AnnotationBypassInbound     = "ambient.istio.io/bypass-inbound-capture"
	AnnotationDNSCapture        = "ambient.istio.io/dns-capture"
	AnnotationVirtualInterfaces = "istio.io/reroute-virtual-interfaces"
)

// PodMeta is what enrollment reads of a pod.
type PodMeta struct {
	Labels, Annotations map[string]string
	HostNetwork         bool
}

// Enrolled tells whether Istio's node agent captures the pod's traffic for
// ztunnel, given its namespace's labels, and why (or why not), for logs.
// It is istio-cni's CompiledEnablementSelectors.Matches
// (cni/pkg/util/enablement_selector.go) with the default enablement
// selectors of the istio-cni chart (values.yaml, ambient.enablementSelectors):
//
//   - a pod on the host's network is never enrolled (no namespace of its
//     own to redirect in), nor a pod with a sidecar;
//   - a pod labeled istio.io/dataplane-mode=ambient is enrolled, whatever
//     its namespace says;
//   - in a namespace labeled istio.io/dataplane-mode=ambient, a pod is
//     enrolled unless it is labeled istio.io/dataplane-mode=none (the
//     selector is NotIn [none]: no label, or any other value, enrolls).
//
// Istio also leaves out pods whose phase is Succeeded or Failed (see
// podwatch.APIPod.Terminating); that is not a matter of labels.
func Enrolled(pod PodMeta, nsLabels map[string]string) (bool, string) {
	if pod.HostNetwork {
		return false, "on the host's network: no namespace of its own to redirect in"
	}
	if _, ok := pod.Annotations[AnnotationSidecarStatus]; ok {
		return false, "has a sidecar (annotation " + AnnotationSidecarStatus + ")"
	}
	mode, labeled := pod.Labels[LabelDataplaneMode]
	switch {
	case mode == DataplaneModeAmbient:
		return true, "pod label " + LabelDataplaneMode + "=" + DataplaneModeAmbient
	case !NamespaceAmbient(nsLabels):
		return false, "no " + LabelDataplaneMode + "=" + DataplaneModeAmbient + " label on the pod or its namespace"
	case mode == DataplaneModeNone:
		return false, "pod label " + LabelDataplaneMode + "=" + DataplaneModeNone + " opts out of its namespace's ambient mode"
	case labeled:
		return true, fmt.Sprintf("namespace label %s=%s (the pod's %q is not %q)", LabelDataplaneMode, DataplaneModeAmbient, mode, DataplaneModeNone)
	}
	return true, "namespace label " + LabelDataplaneMode + "=" + DataplaneModeAmbient
}

// NamespaceAmbient tells whether a namespace's labels put its pods in
// ambient mode (istio-cni's MatchesNamespace with the default selectors).
// Istio looks at a namespace's pods again when this changes.
func NamespaceAmbient(nsLabels map[string]string) bool {
	return nsLabels[LabelDataplaneMode] == DataplaneModeAmbient
}

// ParseOverrides is the Overrides of a pod's annotations: what it changes of the
// in-pod rules. It is istio-cni's getPodLevelTrafficOverrides
// (cni/pkg/nodeagent/net.go):
//
//   - ambient.istio.io/bypass-inbound-capture, a boolean (strconv.ParseBool):
//     Ingress;
//   - ambient.istio.io/dns-capture, a boolean: DNSOn or DNSOff;
//   - istio.io/reroute-virtual-interfaces, a comma-separated list of
//     interface names, blanks around them and empty items dropped:
//     VirtualInterfaces.
//
// The Overrides are always Istio's: a boolean annotation whose value does not
// parse counts as absent, and interface names are kept as they are. The
// error names each annotation Istio ignores (a bad boolean) or that cannot
// be installed (a name no interface can have, which iptables and nft
// refuse): the caller logs it, as Istio does, or refuses the pod.
func ParseOverrides(annotations map[string]string) (Overrides, error) {
	var pod Overrides
	var errs []error
	boolean := func(name string) (value, ok bool) {
		v, present := annotations[name]
		if !present {
			return false, false
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("annotation %s=%q: want a boolean (true, false, 1, 0...); ignored", name, v))
			return false, false
		}
		return b, true
	}
	if v, ok := boolean(AnnotationBypassInbound); ok {
		pod.Ingress = v
	}
	if v, ok := boolean(AnnotationDNSCapture); ok {
		pod.DNS = DNSOff
		if v {
			pod.DNS = DNSOn
		}
	}
	for item := range strings.SplitSeq(annotations[AnnotationVirtualInterfaces], ",") {
		name := strings.TrimSpace(item)
		if name == "" {
			continue
		}
		if err := link.ValidIfName(name); err != nil {
			errs = append(errs, fmt.Errorf("annotation %s: %w", AnnotationVirtualInterfaces, err))
		}
		pod.VirtualInterfaces = append(pod.VirtualInterfaces, name)
	}
	return pod, errors.Join(errs...)
}
