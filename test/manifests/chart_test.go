package manifests

import (
	"fmt"
	"path"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"

	"github.com/meshwire/meshwire/internal/golden"
)

// The chart, and the release it is checked as: what docs/kubernetes.md
// installs (helm install meshwire conf/helm/meshwire -n kube-system).
const (
	chartDir  = "../../conf/helm/meshwire"
	release   = "meshwire"
	namespace = "kube-system"
)

// shipped is the kubectl manifest, the chart rendered with its default
// values after shippedHeader.
const (
	shipped       = dir + "/daemonset.yaml"
	shippedHeader = `# meshwire's node agent for kubectl apply -f: the Helm chart
# conf/helm/meshwire rendered with its default values, as
# helm template meshwire conf/helm/meshwire -n kube-system
# renders it. Generated: edit the chart, then
# MESHWIRE_UPDATE_GOLDEN=1 go test ./test/manifests
# rewrites this file (make test fails while the two differ).
`
)

// render is helm template's rendering of the chart with values over its
// own (nil: the defaults): the values checked against
// values.schema.json, the templates rendered, the manifests in helm's
// install order, each after its "# Source:" line.
func render(values map[string]any) (string, error) {
	return renderChart(chartDir, release, namespace, values)
}

// renderChart is render for any chart: the one in dir, as release name in
// namespace ns.
func renderChart(dir, name, ns string, values map[string]any) (string, error) {
	ch, err := loader.Load(dir)
	if err != nil {
		return "", err
	}
	opts := chartutil.ReleaseOptions{Name: name, Namespace: ns, Revision: 1, IsInstall: true}
	vals, err := chartutil.ToRenderValues(ch, values, opts, chartutil.DefaultCapabilities)
	if err != nil {
		return "", err
	}
	files, err := engine.Render(ch, vals)
	if err != nil {
		return "", err
	}
	for f := range files {
		if path.Base(f) == "NOTES.txt" {
			delete(files, f)
		}
	}
	_, manifests, err := releaseutil.SortManifests(files, nil, releaseutil.InstallOrder)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for _, m := range manifests {
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", m.Name, m.Content)
	}
	return b.String(), nil
}

// chartCase is a set of values and the agent flags it must give.
type chartCase struct {
	values          map[string]any
	flags, noFlags  []string // present, absent
	privileged, cfg bool     // a privileged agent; a ConfigMap
}

var chartCases = map[string]chartCase{
	"defaults": {
		flags:      []string{"--chain", "--cleanup-on-exit", "--fastpath", "--cgroup", "--plugin-log=/var/log/meshwire/cni.log", "--listen=[$(NODE_IP)]:9966"},
		noFlags:    []string{"--conflist", "--ambient", "--intercept"},
		privileged: true,
	},
	"own conflist": {
		values: map[string]any{
			"mode":       "conflist",
			"conflist":   `{"cniVersion": "1.0.0", "name": "pods", "plugins": [{"type": "bridge", "bridge": "mwk0", "isGateway": true, "ipam": {"type": "host-local"}}]}`,
			"podCIDRs":   []any{"198.18.0.0/16", "fd42::/64"},
			"cniVersion": "1.0.0",
			"intercept":  true,
		},
		flags:      []string{"--conflist=/etc/meshwire/meshwire.conflist", "--pod-cidr=198.18.0.0/16", "--pod-cidr=fd42::/64", "--cni-version=1.0.0", "--intercept", "--fastpath"},
		noFlags:    []string{"--chain"},
		privileged: true, cfg: true,
	},
	"built-in conflist, no fast path": {
		values:  map[string]any{"mode": "conflist", "fastpath": false, "cleanupOnExit": false},
		noFlags: []string{"--chain", "--conflist", "--fastpath", "--cgroup", "--cleanup-on-exit"},
	},
	"ambient, another port and log": {
		values: map[string]any{
			"ambient": true, "fastpath": false, "listenPort": 19966, "pluginLog": "/var/log/mw/plugins.log",
			"extraArgs": []any{"--proxy-metadata=ISTIO_META_DNS_CAPTURE=true", "--interval=5s"},
			"image":     map[string]any{"tag": "v2"},
		},
		flags:      []string{"--chain", "--ambient", "--listen=[$(NODE_IP)]:19966", "--plugin-log=/var/log/mw/plugins.log", "--proxy-metadata=ISTIO_META_DNS_CAPTURE=true", "--interval=5s"},
		noFlags:    []string{"--fastpath"},
		privileged: true,
	},
}

// TestChartLint is helm lint of the chart, with each case's values:
// nothing worse than information.
func TestChartLint(t *testing.T) {
	for name, c := range chartCases {
		l := lint.All(chartDir, c.values, namespace, true)
		for _, m := range l.Messages {
			if m.Severity > support.InfoSev {
				t.Errorf("%s: %v", name, m)
			}
		}
	}
}

// TestChartRendersShippedManifest: the kubectl manifest is the chart's
// rendering with its default values, so the two cannot drift.
func TestChartRendersShippedManifest(t *testing.T) {
	out, err := render(nil)
	if err != nil {
		t.Fatal(err)
	}
	golden.CheckFile(t, shipped, shippedHeader+out)
}

// TestChartRenderings holds every rendering of the chart to the checks of
// the shipped manifest (strict decoding, the DaemonSet's mounts, probes,
// port, privileges and command line, the API access) and to its values.
func TestChartRenderings(t *testing.T) {
	for name, c := range chartCases {
		t.Run(name, func(t *testing.T) {
			out, err := render(c.values)
			if err != nil {
				t.Fatal(err)
			}
			docs := splitDocuments(t, name, []byte(out))
			decodeStrictly(t, name, docs)
			flags := checkDaemonSet(t, name, docs)
			a := loadAPIAccess(t, name, docs)
			for _, p := range a.problems() {
				t.Error(p)
			}
			node := a.ds.Spec.Template.Spec.Containers[0]
			for _, f := range c.flags {
				// a flag with its value is one item (a repeated flag
				// keeps one value in flags)
				if _, ok := flags[f]; !ok && !slices.Contains(node.Command, f) {
					t.Errorf("no %s in the command %q", f, node.Command)
				}
			}
			for _, f := range c.noFlags {
				if _, ok := flags[f]; ok {
					t.Errorf("%s in the command %q", f, node.Command)
				}
			}
			sc := node.SecurityContext
			if got := sc != nil && sc.Privileged != nil && *sc.Privileged; got != c.privileged {
				t.Errorf("privileged %v, want %v", got, c.privileged)
			}
			if got := strings.Contains(out, "\nkind: ConfigMap\n"); got != c.cfg {
				t.Errorf("a ConfigMap: %v, want %v", got, c.cfg)
			}
		})
	}
}

// TestChartSchemaRefuses: values.schema.json refuses a wrong type, a key
// it does not know, and conflist settings in chain mode, naming the key.
func TestChartSchemaRefuses(t *testing.T) {
	for name, c := range map[string]struct {
		values map[string]any
		names  string
	}{
		"a port as a string":          {map[string]any{"listenPort": "9966"}, "listenPort"},
		"a flag as a string":          {map[string]any{"fastpath": "true"}, "fastpath"},
		"an unknown key":              {map[string]any{"fastPath": true}, "fastPath"},
		"an unknown key in image":     {map[string]any{"image": map[string]any{"name": "meshwire"}}, "name"},
		"tolerations as a string":     {map[string]any{"tolerations": "all"}, "tolerations"},
		"another mode":                {map[string]any{"mode": "standalone"}, "mode"},
		"a conflist with --chain":     {map[string]any{"conflist": "{}"}, "conflist"},
		"a pod CIDR with --chain":     {map[string]any{"podCIDRs": []any{"198.18.0.0/16"}}, "podCIDRs"},
		"a relative plugin log":       {map[string]any{"pluginLog": "cni.log"}, "pluginLog"},
		"an extra argument, no flag":  {map[string]any{"extraArgs": []any{"node"}}, "extraArgs"},
		"a CPU request as a list":     {map[string]any{"resources": map[string]any{"requests": map[string]any{"cpu": []any{1}}}}, "cpu"},
		"a node selector not strings": {map[string]any{"nodeSelector": map[string]any{"disk": 1}}, "disk"},
	} {
		_, err := render(c.values)
		if err == nil {
			t.Errorf("%s: rendered", name)
			continue
		}
		if !strings.Contains(err.Error(), c.names) {
			t.Errorf("%s: the refusal does not name %s: %v", name, c.names, err)
		}
		t.Logf("%s: %v", name, strings.Join(strings.Fields(err.Error()), " "))
	}
}
