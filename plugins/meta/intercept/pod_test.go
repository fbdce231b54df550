package main

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
)

func TestDecide(t *testing.T) {
	istio := map[string]string{annIstioStatus: `{"containers":["istio-proxy"]}`}
	with := func(base map[string]string, kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	ann := func(m map[string]string) *map[string]string { return &m }
	for _, tc := range []struct {
		name      string
		ann       *map[string]string
		cniArgs   string
		excluded  []string
		meta      map[string]string // the config's proxyMetadata
		cfgArgs   []string          // the config's flags
		intercept bool
		args      []string
		err       string
	}{
		{name: "podman: no capability, no pod name", intercept: true},
		{name: "podman with unrelated CNI_ARGS", cniArgs: "IgnoreUnknown=1;IP=10.0.0.5", intercept: true},
		{name: "istio sidecar", ann: ann(istio), cniArgs: "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart-1", intercept: true,
			args: []string{"--istio-local-exclude-ports=15020,15021,15090"}},
		{name: "no sidecar", ann: ann(map[string]string{"app": "x"}), cniArgs: "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=job-1"},
		{name: "empty annotations", ann: ann(map[string]string{})},
		{name: "inject false wins over the status", ann: ann(with(istio, annIstioInject, "false"))},
		{name: "kube-system excluded by default", ann: ann(istio), cniArgs: "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=dns"},
		{name: "excluded list replaced", ann: ann(istio), cniArgs: "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=x", excluded: []string{}, intercept: true,
			args: []string{"--istio-local-exclude-ports=15020,15021,15090"}},
		{name: "own excluded namespace", ann: ann(istio), cniArgs: "K8S_POD_NAMESPACE=batch;K8S_POD_NAME=x", excluded: []string{"batch"}},
		{name: "pod name without annotations: cannot tell, skip", cniArgs: "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=x"},
		{name: "meshwire annotation", ann: ann(map[string]string{annMeshwire: "true"}), intercept: true},
		{name: "meshwire false wins", ann: ann(with(istio, annMeshwire, "false"))},
		{name: "meshwire malformed", ann: ann(map[string]string{annMeshwire: "yes"}), err: annMeshwire},
		{name: "per-pod settings", ann: ann(with(istio,
			"sidecar.istio.io/interceptionMode", "TPROXY",
			"traffic.sidecar.istio.io/excludeOutboundIPRanges", "10.96.0.1/32",
			"traffic.sidecar.istio.io/excludeInboundPorts", "8081,15021",
			"unrelated", "x")),
			intercept: true,
			args: []string{"--istio-inbound-interception-mode=TPROXY", "--istio-service-exclude-cidr=10.96.0.1/32",
				"--istio-local-exclude-ports=8081,15021", "--istio-local-exclude-ports=8081,15021,15020,15090"}},
		// istio-cni's rules for Istio pods.
		{name: "status ports always excluded", ann: ann(istio), cfgArgs: []string{"--istio-local-exclude-ports=15020"}, intercept: true,
			args: []string{"--istio-local-exclude-ports=15020,15021,15090"}},
		{name: "istio-init: the init container does it", ann: ann(map[string]string{annIstioStatus: `{"initContainers":["istio-init"],"containers":["istio-proxy"]}`})},
		{name: "no istio-proxy", ann: ann(map[string]string{annIstioStatus: `{"initContainers":["istio-validation"],"containers":["other"]}`})},
		{name: "native sidecar (istio-proxy an init container)", ann: ann(map[string]string{annIstioStatus: `{"initContainers":["istio-validation","istio-proxy"],"containers":[]}`}),
			intercept: true, args: []string{"--istio-local-exclude-ports=15020,15021,15090"}},
		{name: "status without the container lists", ann: ann(map[string]string{annIstioStatus: "true"}), intercept: true,
			args: []string{"--istio-local-exclude-ports=15020,15021,15090"}},
		{name: "DISABLE_ENVOY", ann: ann(with(istio, annProxyConfig, "proxyMetadata:\n  DISABLE_ENVOY: \"true\"\n"))},
		{name: "gateway", ann: ann(with(istio, annIstioTemplates, "gateway"))},
		{name: "inject False (ParseBool)", ann: ann(with(istio, annIstioInject, "False"))},
		{name: "proxy metadata", ann: ann(with(istio, annProxyConfig, `{"proxyMetadata":{"ISTIO_META_DNS_CAPTURE":"true","INVALID_DROP":"1","ISTIO_DUAL_STACK":"nope"}}`)),
			intercept: true, args: []string{"--istio-local-exclude-ports=15020,15021,15090",
				"--redirect-dns=true", "--capture-all-dns=true", "--dual-stack=false", "--drop-invalid=true"}},
		{name: "mesh-wide metadata, overridden by the pod", ann: ann(with(istio, annProxyConfig, "proxyMetadata:\n  ISTIO_META_DNS_CAPTURE: \"false\"\n")),
			meta: map[string]string{"ISTIO_META_DNS_CAPTURE": "true", "INVALID_DROP": "true"}, intercept: true,
			args: []string{"--istio-local-exclude-ports=15020,15021,15090", "--redirect-dns=false", "--capture-all-dns=false", "--drop-invalid=true"}},
		{name: "proxy config not YAML", ann: ann(with(istio, annProxyConfig, "proxyMetadata: [")), err: annProxyConfig},
		{name: "reroute-virtual-interfaces wins over kubevirtInterfaces", ann: ann(with(istio,
			"traffic.sidecar.istio.io/kubevirtInterfaces", "old0", annRerouteVirtual, "new0")), intercept: true,
			args: []string{"--kube-virt-interfaces=old0", "--kube-virt-interfaces=new0", "--istio-local-exclude-ports=15020,15021,15090"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			excluded := tc.excluded
			if excluded == nil {
				excluded = defaultExcludedNamespaces
			}
			d, err := decide(podFrom(tc.ann, tc.cniArgs), excluded, tc.meta, tc.cfgArgs)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one naming %s", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d.Intercept != tc.intercept || !slices.Equal(d.Args, tc.args) || d.Why == "" {
				t.Fatalf("got %+v, want intercept %v with args %q (and a reason)", d, tc.intercept, tc.args)
			}
		})
	}
}

// TestParsePodConfig: the annotations' settings apply on top of the
// config's, and a malformed one fails with code 7 naming the annotation.
func TestParsePodConfig(t *testing.T) {
	conf := func(annotations string) []byte {
		return []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"n","type":"intercept","istio-service-cidr":"*",
			"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{%q:"{}"%s}}}`, annIstioStatus, annotations))
	}
	_, o, d, err := parsePodConfig(conf(`,"sidecar.istio.io/interceptionMode":"TPROXY"`), "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b")
	if err != nil || !d.Intercept || o.Config.Mode != "TPROXY" || !o.Config.OutboundCIDRs.All {
		t.Fatalf("got %+v %+v %v: want TPROXY from the annotation and * from the config", o.Config, d, err)
	}
	for _, tc := range []struct{ ann, name string }{
		{`,"traffic.sidecar.istio.io/includeInboundPorts":"80,x"`, "traffic.sidecar.istio.io/includeInboundPorts"},
		{`,"traffic.sidecar.istio.io/excludeOutboundIPRanges":"10.0.0.0/99"`, "traffic.sidecar.istio.io/excludeOutboundIPRanges"},
		{`,"sidecar.istio.io/interceptionMode":"BOGUS"`, "sidecar.istio.io/interceptionMode"},
	} {
		_, _, _, err := parsePodConfig(conf(tc.ann), "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b")
		te, ok := err.(*types.Error)
		if !ok || te.Code != 7 || !strings.Contains(te.Msg, "annotation "+tc.name) {
			t.Errorf("%s: %v, want code 7 naming the annotation", tc.ann, err)
		}
	}
	// A pod without a sidecar is not checked against its annotations.
	_, _, d, err = parsePodConfig([]byte(`{"cniVersion":"1.1.0","name":"n","type":"intercept","runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"traffic.sidecar.istio.io/includeInboundPorts":"x"}}}`), "")
	if err != nil || d.Intercept {
		t.Fatalf("no sidecar: %+v %v", d, err)
	}
}

// TestDecideFastpath: a meshed pod gets a fast-path policy (an Istio
// sidecar's proxy is fed, another mesh's is not, the annotation decides
// over both); a pod that is not meshed, or not a Kubernetes pod, gets none;
// a malformed annotation is the pod's config error naming it.
func TestDecideFastpath(t *testing.T) {
	const k8s = "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=p"
	istio := `{"containers":["istio-proxy"]}`
	for _, tc := range []struct {
		name string
		ann  map[string]string // nil: not a Kubernetes pod
		want *podpolicy.Policy
		err  bool
	}{
		{name: "podman: no policy"},
		{name: "istio: fed", ann: map[string]string{annIstioStatus: istio}, want: &podpolicy.Policy{IntoProxy: true}},
		{name: "istio opted out", ann: map[string]string{annIstioStatus: istio, annIntoProxy: "false"}, want: &podpolicy.Policy{}},
		{name: "istio, shaped: never paired with another pod", ann: map[string]string{annIstioStatus: istio, annEgressBandwidth: "10M"}, want: &podpolicy.Policy{IntoProxy: true, NoPeer: true}},
		{name: "istio, ingress shaped", ann: map[string]string{annIstioStatus: istio, annIngressBandwidth: "1G"}, want: &podpolicy.Policy{IntoProxy: true, NoPeer: true}},
		{name: "istio-init pod: the plugin still writes it", ann: map[string]string{annIstioStatus: `{"initContainers":["istio-init"],"containers":["istio-proxy"]}`},
			want: &podpolicy.Policy{IntoProxy: true}},
		{name: "another mesh: not fed", ann: map[string]string{annMeshwire: "true"}, want: &podpolicy.Policy{}},
		{name: "another mesh opted in", ann: map[string]string{annMeshwire: "true", annIntoProxy: "true"}, want: &podpolicy.Policy{IntoProxy: true}},
		{name: "no sidecar", ann: map[string]string{annIntoProxy: "true"}},
		{name: "no istio-proxy container", ann: map[string]string{annIstioStatus: `{"containers":["app"]}`}},
		{name: "malformed", ann: map[string]string{annIstioStatus: istio, annIntoProxy: "yes"}, err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ann *map[string]string
			args := ""
			if tc.ann != nil {
				ann, args = &tc.ann, k8s
			}
			d, err := decide(podFrom(ann, args), defaultExcludedNamespaces, nil, nil)
			if tc.err {
				te, ok := err.(*types.Error)
				if !ok || te.Code != 7 || !strings.Contains(te.Msg, annIntoProxy) {
					t.Fatalf("err %v, want code 7 naming %s", err, annIntoProxy)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (d.Fastpath == nil) != (tc.want == nil) || (d.Fastpath != nil && *d.Fastpath != *tc.want) {
				t.Fatalf("policy %+v, want %+v", d.Fastpath, tc.want)
			}
		})
	}
}
