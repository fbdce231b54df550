package ambient

import (
	"slices"
	"strings"
	"testing"
)

var (
	ambientLabel = map[string]string{LabelDataplaneMode: DataplaneModeAmbient}
	noneLabel    = map[string]string{LabelDataplaneMode: DataplaneModeNone}
	sidecar      = map[string]string{AnnotationSidecarStatus: "test"}
)

// TestEnrolled: Istio's cases first (TestEnablementSelectorMatches,
// cni/pkg/util/podutil_test.go, with its default selectors), then what
// the default selectors imply beyond them.
func TestEnrolled(t *testing.T) {
	for _, c := range []struct {
		name string
		pod  PodMeta
		ns   map[string]string
		want bool
		why  string // a part of the reason
	}{
		// Istio's.
		{name: "ambient mode enabled for namespace", ns: ambientLabel, want: true, why: "namespace label"},
		{name: "ambient mode enabled for pod", pod: PodMeta{Labels: ambientLabel}, want: true, why: "pod label"},
		{name: "ambient mode enabled for both namespace and pod", pod: PodMeta{Labels: ambientLabel}, ns: ambientLabel, want: true, why: "pod label"},
		{name: "ambient mode enabled for neither namespace nor pod", want: false, why: "no istio.io/dataplane-mode=ambient label"},
		{name: "pod has sidecar and namespace has ambient enabled", pod: PodMeta{Annotations: sidecar}, ns: ambientLabel, want: false, why: "sidecar"},
		{name: "pod has label to disable ambient redirection", pod: PodMeta{Labels: noneLabel}, ns: ambientLabel, want: false, why: "opts out"},
		{name: "pod has sidecar, pod has ambient mode label", pod: PodMeta{Labels: ambientLabel, Annotations: sidecar}, want: false, why: "sidecar"},
		{name: "hostNetwork pod in ambient-enabled namespace", pod: PodMeta{HostNetwork: true}, ns: ambientLabel, want: false, why: "host's network"},
		{name: "hostNetwork pod with ambient mode label", pod: PodMeta{Labels: ambientLabel, HostNetwork: true}, want: false, why: "host's network"},

		// The selectors' consequences.
		{name: "pod label wins over the namespace's none", pod: PodMeta{Labels: ambientLabel}, ns: noneLabel, want: true, why: "pod label"},
		{name: "pod none in a plain namespace", pod: PodMeta{Labels: noneLabel}, want: false, why: "no istio.io/dataplane-mode=ambient label"},
		{name: "pod with another value in an ambient namespace (NotIn [none])", pod: PodMeta{Labels: map[string]string{LabelDataplaneMode: "sidecar"}}, ns: ambientLabel, want: true, why: `"sidecar" is not "none"`},
		{name: "namespace with another value", ns: map[string]string{LabelDataplaneMode: "Ambient"}, want: false},
		{name: "the label as an annotation does nothing", pod: PodMeta{Annotations: ambientLabel}, want: false},
		// Istio 1.23 (release note 50804): the status annotation is no
		// opt-out any more.
		{name: "redirection=disabled is not an opt-out", pod: PodMeta{Annotations: map[string]string{AnnotationRedirection: "disabled"}}, ns: ambientLabel, want: true},
		{name: "an empty sidecar status still means a sidecar", pod: PodMeta{Annotations: map[string]string{AnnotationSidecarStatus: ""}}, ns: ambientLabel, want: false, why: "sidecar"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, why := Enrolled(c.pod, c.ns)
			if got != c.want || !strings.Contains(why, c.why) || why == "" {
				t.Errorf("Enrolled = %v, %q; want %v, a reason with %q", got, why, c.want, c.why)
			}
		})
	}
}

// TestOverrides: Istio's cases (TestGetPodLevelOverrides,
// cni/pkg/nodeagent/net_test.go), names and all, then the errors.
func TestOverrides(t *testing.T) {
	for _, c := range []struct {
		name    string
		in      map[string]string
		want    Overrides
		errWith []string // the annotations the error names
	}{
		{name: "pod dns override", in: map[string]string{AnnotationDNSCapture: "true"}, want: Overrides{DNS: DNSOn}},
		{name: "no pod dns set", want: Overrides{}},
		{name: "pod dns disabled", in: map[string]string{AnnotationDNSCapture: "false"}, want: Overrides{DNS: DNSOff}},
		{
			name: "pod dns disabled, ingress mode enabled, two virt interfaces", // (Istio's name; its DNS is "true")
			in:   map[string]string{AnnotationDNSCapture: "true", AnnotationBypassInbound: "true", AnnotationVirtualInterfaces: "en0ps1, en1ps1"},
			want: Overrides{DNS: DNSOn, Ingress: true, VirtualInterfaces: []string{"en0ps1", "en1ps1"}},
		},
		{
			name:    "various manglings",
			in:      map[string]string{AnnotationDNSCapture: "tweedledum", AnnotationBypassInbound: "tweedledee", AnnotationVirtualInterfaces: "asd^&&*$&*(#$&*(#&$*())),   "},
			want:    Overrides{VirtualInterfaces: []string{"asd^&&*$&*(#$&*(#&$*()))"}},
			errWith: []string{AnnotationDNSCapture, AnnotationBypassInbound, AnnotationVirtualInterfaces},
		},

		{name: "ParseBool's other spellings", in: map[string]string{AnnotationBypassInbound: "1", AnnotationDNSCapture: "F"}, want: Overrides{Ingress: true, DNS: DNSOff}},
		{name: "ingress explicitly off", in: map[string]string{AnnotationBypassInbound: "false"}, want: Overrides{}},
		{name: "empty boolean", in: map[string]string{AnnotationDNSCapture: ""}, want: Overrides{}, errWith: []string{AnnotationDNSCapture}},
		{name: "only separators", in: map[string]string{AnnotationVirtualInterfaces: " , ,"}, want: Overrides{}},
		{name: "a name with a slash", in: map[string]string{AnnotationVirtualInterfaces: "eth0,a/b"}, want: Overrides{VirtualInterfaces: []string{"eth0", "a/b"}}, errWith: []string{AnnotationVirtualInterfaces}},
		{name: "unrelated annotations", in: map[string]string{AnnotationSidecarStatus: "x", AnnotationRedirection: "enabled"}, want: Overrides{}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, err := ParseOverrides(c.in)
			if got.Ingress != c.want.Ingress || got.DNS != c.want.DNS || !slices.Equal(got.VirtualInterfaces, c.want.VirtualInterfaces) {
				t.Errorf("Overrides = %+v, want %+v", got, c.want)
			}
			if (err != nil) != (len(c.errWith) > 0) {
				t.Fatalf("error %v, want one naming %q", err, c.errWith)
			}
			for _, a := range c.errWith {
				if !strings.Contains(err.Error(), a) {
					t.Errorf("error %q does not name %s", err, a)
				}
			}
		})
	}
}
