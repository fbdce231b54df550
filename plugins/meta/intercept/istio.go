package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/meshwire/meshwire/internal/cnierr"
)

// Istio pods, as istio-cni's sidecar plugin (cni/pkg/plugin, Istio 1.30)
// decides for them, from what the runtime passes: the pod's annotations
// (the CRI capability) and CNI_ARGS. istio-cni reads the pod from the API
// server; meshwire has no API access, so the pod's containers come from
// the injector's sidecar.istio.io/status annotation and the sidecar's
// environment from the proxy.istio.io/config annotation's proxyMetadata
// (which the injector turns into that environment), over the plugin
// config's proxyMetadata (the mesh-wide defaults, as meshConfig's
// defaultConfig.proxyMetadata).

const (
	annIstioTemplates = "inject.istio.io/templates"
	annProxyConfig    = "proxy.istio.io/config"
	annRerouteVirtual = "istio.io/reroute-virtual-interfaces"
	annExcludeInbound = "traffic.sidecar.istio.io/excludeInboundPorts"
)

// statusPorts are the sidecar's own ports that istio-cni never captures
// inbound, whatever the pod says: pilot-agent's merged metrics and health
// (15020), its readiness probe (15021) and Envoy's Prometheus endpoint
// (15090).
const statusPorts = "15020,15021,15090"

// istioStatus is the part of sidecar.istio.io/status naming the containers
// the injector added.
type istioStatus struct {
	InitContainers []string `json:"initContainers"`
	Containers     []string `json:"containers"`
}

// proxyMetadata merges the sidecar's environment as the injector does: the
// mesh-wide values, then the pod's proxy.istio.io/config proxyMetadata
// key by key. A proxy.istio.io/config that is not YAML (or JSON) is a
// config error naming the annotation.
func proxyMetadata(mesh map[string]string, a map[string]string) (map[string]string, error) {
	out := map[string]string{}
	for k, v := range mesh {
		out[k] = v
	}
	if raw, ok := a[annProxyConfig]; ok {
		var pc struct {
			ProxyMetadata map[string]string `json:"proxyMetadata"`
		}
		if err := yaml.Unmarshal([]byte(raw), &pc); err != nil {
			return nil, cnierr.Field(annProxyConfig, "annotation: not a ProxyConfig: %v", err)
		}
		for k, v := range pc.ProxyMetadata {
			out[k] = v
		}
	}
	return out, nil
}

// boolOf reads a boolean of the sidecar's environment as istio-cni does
// (strconv.ParseBool; anything else is false).
func boolOf(meta map[string]string, key string) (value, set bool) {
	v, ok := meta[key]
	if !ok {
		return false, false
	}
	b, err := strconv.ParseBool(v)
	return err == nil && b, true
}

// istioSkip says why istio-cni leaves a pod carrying
// sidecar.istio.io/status alone, or "" when it intercepts it; init is set
// when the pod's istio-init container installs the rules. A status that
// is not the injector's JSON names no containers: the pod is taken to
// have its sidecar.
func istioSkip(a, meta map[string]string) (why string, init bool) {
	var st istioStatus
	if json.Unmarshal([]byte(a[annIstioStatus]), &st) == nil && (st.Containers != nil || st.InitContainers != nil) {
		if slices.Contains(st.InitContainers, "istio-init") {
			return "injected with the istio-init container, which installs the rules itself", true
		}
		if !slices.Contains(st.Containers, "istio-proxy") && !slices.Contains(st.InitContainers, "istio-proxy") {
			return "no istio-proxy container in " + annIstioStatus, false
		}
	}
	if off, _ := boolOf(meta, "DISABLE_ENVOY"); off {
		return "DISABLE_ENVOY is set for its istio-proxy", false
	}
	if slices.Contains(strings.Split(a[annIstioTemplates], ","), "gateway") {
		return "its proxy is a gateway (" + annIstioTemplates + "), not a sidecar", false
	}
	return "", false
}

// istioArgs are the settings istio-cni's NewRedirect gives the pod, as
// iptables-init flags after the config's (cfgArgs): the annotations'
// (annotationArgs), the inbound exclusions with the status ports always
// added, and DNS capture, dual stack and invalid-packet drop from the
// sidecar's environment. sources names what set each flag, for errors.
func istioArgs(a, meta map[string]string, cfgArgs []string) (args []string, sources map[string]string) {
	args, sources = annotationArgs(a)
	exclude, from := lastFlag(cfgArgs, "istio-local-exclude-ports"), "istio-local-exclude-ports"
	if v, ok := a[annExcludeInbound]; ok {
		exclude, from = v, "annotation "+annExcludeInbound
	}
	args = append(args, "--istio-local-exclude-ports="+withStatusPorts(exclude))
	sources["istio-local-exclude-ports"] = from
	for _, m := range []struct{ env, flag string }{
		{"ISTIO_META_DNS_CAPTURE", "redirect-dns"},
		{"ISTIO_META_DNS_CAPTURE", "capture-all-dns"}, // istio-cni captures all DNS
		{"ISTIO_DUAL_STACK", "dual-stack"},
		{"INVALID_DROP", "drop-invalid"},
	} {
		if v, set := boolOf(meta, m.env); set {
			args = append(args, fmt.Sprintf("--%s=%t", m.flag, v))
			sources[m.flag] = annProxyConfig + " proxyMetadata " + m.env
		}
	}
	return args, sources
}

// withStatusPorts appends statusPorts to a port list, dropping repeats, as
// istio-cni does.
func withStatusPorts(list string) string {
	var out []string
	for _, p := range strings.Split(strings.TrimSpace(list)+","+statusPorts, ",") {
		if p != "" && !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return strings.Join(out, ",")
}

// lastFlag is the value the last --flag=value of args sets, or "".
func lastFlag(args []string, flag string) string {
	v := ""
	for _, a := range args {
		if rest, ok := strings.CutPrefix(a, "--"+flag+"="); ok {
			v = rest
		}
	}
	return v
}
