package main

import (
	"testing"

	"github.com/meshwire/meshwire/internal/cnierr"
)

// FuzzParseConfig: any input gives a config or a CNI error of code 6 or 7,
// never a panic, also with a pod's annotations.
func FuzzParseConfig(f *testing.F) {
	f.Add(string(conf(`"istio-service-cidr":"*","istio-inbound-ports":"*"`)))
	f.Add(string(conf(`"istio-inbound-ports":[80,"443"],"proxy-gid":[1,2]`)))
	f.Add(string(conf(`"istio-inbound-interception-mode":"TPROXY","istio-inbound-tproxy-mark":"0x10"`)))
	f.Add(`{"type":"intercept","envoy-port":1e3}`)
	f.Add(`[]`)
	f.Add(`{"type":"intercept","runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"sidecar.istio.io/status":"{}","traffic.sidecar.istio.io/includeInboundPorts":"80,x"}}}`)
	f.Add(`{"type":"intercept","excludeNamespaces":["a"],"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"intercept.meshwire.io/enabled":"maybe"}}}`)
	// Istio pods: the status' container lists, proxy.istio.io/config,
	// the mesh-wide proxyMetadata.
	f.Add(`{"type":"intercept","istio-local-exclude-ports":"15020","proxyMetadata":{"ISTIO_META_DNS_CAPTURE":"true"},"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"sidecar.istio.io/status":"{\"initContainers\":[\"istio-validation\"],\"containers\":[\"istio-proxy\"]}","proxy.istio.io/config":"proxyMetadata:\n  INVALID_DROP: \"1\"\n","traffic.sidecar.istio.io/excludeInboundPorts":"8080,"}}}`)
	f.Add(`{"type":"intercept","runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"sidecar.istio.io/status":"{\"initContainers\":[\"istio-init\"]}","proxy.istio.io/config":"{proxyMetadata: [}"}}}`)
	f.Add(`{"type":"intercept","proxyMetadata":[1],"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"sidecar.istio.io/status":"true","istio.io/reroute-virtual-interfaces":"eth1,,","inject.istio.io/templates":"sidecar,gateway"}}}`)
	f.Fuzz(func(t *testing.T, data string) {
		// The per-pod path obeys the same contract.
		if _, _, _, err := parsePodConfig([]byte(data), "K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p"); err != nil {
			if c := cnierr.Code(err); c != 6 && c != 7 {
				t.Fatalf("per pod: code %d for %q: %v", c, data, err)
			}
		}
		_, o, err := parseConfig([]byte(data))
		if err != nil {
			if c := cnierr.Code(err); c != 6 && c != 7 {
				t.Fatalf("code %d for %q: %v", c, data, err)
			}
			return
		}
		if o.Config.ProxyPort == 0 || o.Config.ProxyPort == o.Config.InboundCapturePort {
			t.Fatalf("accepted unusable ports %+v", o.Config)
		}
	})
}
