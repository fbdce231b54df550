package framework

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// Manifest reads manifests/NAME of the cluster's directory with every
// @KEY@ replaced by vars[KEY], or else by the cluster's FamilyVars; a
// placeholder neither fills is an error, so that no manifest is applied
// half-rendered.
func (c *Cluster) Manifest(name string, vars map[string]string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(c.Repo, "test", "cluster", "manifests", name))
	if err != nil {
		return nil, err
	}
	all := c.FamilyVars()
	for k, v := range vars {
		all[k] = v
	}
	return Render(b, all)
}

// FamilyVars are the placeholders any manifest may use for the cluster's
// address families: @IP_FAMILY_POLICY@, a Service's ipFamilyPolicy
// (SingleStack, or RequireDualStack on a dual-stack cluster), and
// @ISTIO_DUAL_STACK@ (false, or true on a dual-stack cluster), the
// sidecars' ISTIO_DUAL_STACK, which is how Istio turns a pod's IPv6
// capture on where its first address is IPv4.
func (d Description) FamilyVars() map[string]string {
	if d.Family() == "dual" {
		return map[string]string{"IP_FAMILY_POLICY": "RequireDualStack", "ISTIO_DUAL_STACK": "true"}
	}
	return map[string]string{"IP_FAMILY_POLICY": "SingleStack", "ISTIO_DUAL_STACK": "false"}
}

var placeholder = regexp.MustCompile(`@[A-Z_]+@`)

// Render replaces every @KEY@ of b by vars[KEY] (lines that begin with #
// are comments and keep theirs).
func Render(b []byte, vars map[string]string) ([]byte, error) {
	lines := strings.Split(string(b), "\n")
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		var missing []string
		lines[i] = placeholder.ReplaceAllStringFunc(l, func(p string) string {
			v, ok := vars[strings.Trim(p, "@")]
			if !ok {
				missing = append(missing, p)
			}
			return v
		})
		if len(missing) > 0 {
			return nil, fmt.Errorf("line %d: nothing to fill %s with", i+1, strings.Join(missing, ", "))
		}
	}
	return []byte(strings.Join(lines, "\n")), nil
}

// Placement names two nodes for pods that must run apart: the first two
// nodes of the cluster, or its one node twice.
func (c *Cluster) Placement() (a, b string) {
	a, b = c.Nodes[0].Name, c.Nodes[0].Name
	if len(c.Nodes) > 1 {
		b = c.Nodes[1].Name
	}
	return a, b
}

// IstioInitArgs are the arguments Istio's sidecar injector gives the
// istio-init container with its default values (istio.io/istio's
// injection-template.yaml), for mode REDIRECT or TPROXY, after
// pilot-agent's subcommand istio-iptables (meshwire's iptables-init takes
// the same flags without it).
func IstioInitArgs(mode string) []string {
	return []string{"-p", "15001", "-z", "15006", "-u", "1337", "-m", mode, "-i", "*", "-x", "", "-b", "*",
		"-d", "15090,15021,15020", "--log_output_level=default:info"}
}

// DecodePod decodes a rendered manifest of one Pod strictly (a key the
// Pod type does not know is an error).
func DecodePod(b []byte) (*corev1.Pod, error) {
	p := &corev1.Pod{}
	if err := yaml.UnmarshalStrict(b, p); err != nil {
		return nil, err
	}
	if p.Kind != "Pod" {
		return nil, fmt.Errorf("kind %q, want Pod", p.Kind)
	}
	return p, nil
}
