package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/cniplugin"
	"github.com/meshwire/meshwire/internal/intercept/flags"
)

const pluginType = "intercept"

// ruleKeys are the config keys: iptables-init's long flag names, with the
// same meaning and defaults. The flags that are about running a command
// (dry run, cleanup, reconcile, validation, namespace, resolv.conf) have no
// place in a plugin config.
var ruleKeys = []string{
	"envoy-port", "inbound-capture-port", "inbound-tunnel-port", "proxy-uid", "proxy-gid",
	"istio-inbound-interception-mode", "ebpf-fallback", "istio-inbound-tproxy-mark", "istio-inbound-tproxy-route-table",
	"istio-inbound-ports", "istio-local-exclude-ports", "istio-service-cidr", "istio-service-exclude-cidr",
	"istio-outbound-ports", "istio-local-outbound-ports-exclude", "kube-virt-interfaces", "istio-exclude-interfaces",
	"redirect-dns", "capture-all-dns", "drop-invalid", "dual-stack", "iptables-backend",
}

type config struct {
	cniplugin.Base
	// ExcludeNamespaces are Kubernetes namespaces never intercepted
	// (default kube-system; [] excludes none).
	ExcludeNamespaces *[]string `json:"excludeNamespaces"`
	// ProxyMetadata is the mesh-wide environment of Istio's sidecars
	// (meshConfig's defaultConfig.proxyMetadata), which a pod's
	// proxy.istio.io/config overrides key by key: ISTIO_META_DNS_CAPTURE,
	// ISTIO_DUAL_STACK, INVALID_DROP and DISABLE_ENVOY are read.
	ProxyMetadata map[string]string `json:"proxyMetadata"`
	RuntimeConfig struct {
		PodAnnotations *map[string]string `json:"io.kubernetes.cri.pod-annotations"`
	} `json:"runtimeConfig"`
}

// parseConfig decodes stdin and reads the interception settings from the
// keys named after iptables-init's flags (what DEL, STATUS and GC need).
func parseConfig(data []byte) (*config, flags.Options, error) {
	c, args, err := decodeConfig(data)
	if err != nil {
		return nil, flags.Options{}, err
	}
	o, err := parseArgs(args, func(flag string) string { return flag })
	return c, o, err
}

// parsePodConfig is parseConfig for one pod (ADD and CHECK): whether to
// intercept it, and its annotations' settings on top of the config's.
func parsePodConfig(data []byte, cniArgs string) (*config, flags.Options, decision, error) {
	c, args, err := decodeConfig(data)
	if err != nil {
		return nil, flags.Options{}, decision{}, err
	}
	excluded := defaultExcludedNamespaces
	if c.ExcludeNamespaces != nil {
		excluded = *c.ExcludeNamespaces
	}
	p := podFrom(c.RuntimeConfig.PodAnnotations, cniArgs)
	d, err := decide(p, excluded, c.ProxyMetadata, args)
	d.Pod = p
	if err != nil {
		return nil, flags.Options{}, d, err
	}
	// A bad value is named after the annotation that set it, if one did.
	o, err := parseArgs(append(args, d.Args...), func(flag string) string {
		if src, ok := d.Sources[flag]; ok {
			return src
		}
		return flag
	})
	return c, o, d, err
}

func decodeConfig(data []byte) (*config, []string, error) {
	var c config
	if err := cniplugin.Decode(data, pluginType, &c); err != nil {
		return nil, nil, err
	}
	var raw map[string]json.RawMessage
	if err := cniplugin.Unmarshal(data, &raw, ""); err != nil {
		return nil, nil, err
	}
	args, err := configArgs(raw)
	if err != nil {
		return nil, nil, err
	}
	return &c, args, nil
}

// parseArgs parses the flag line built from the config (and a pod's
// annotations); a bad value is a config error naming what set it.
func parseArgs(args []string, name func(flag string) string) (flags.Options, error) {
	o, err := flags.Parse(args, func(string) string { return "" })
	if err != nil {
		var ue *flags.UsageError
		if errors.As(err, &ue) && ue.Long != "" {
			return flags.Options{}, cnierr.Field(name(ue.Long), "%s", ue.Msg)
		}
		return flags.Options{}, cnierr.Config("%v", err)
	}
	return o, nil
}

// configArgs turns the config's flag-named keys into a command line. A
// value is a string, a number, true/false, or a list of strings and
// numbers (joined with commas, as on the command line).
func configArgs(raw map[string]json.RawMessage) ([]string, error) {
	var keys []string
	for k := range raw {
		if flags.Known(k) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var args []string
	for _, k := range keys {
		if !slices.Contains(ruleKeys, k) {
			return nil, cnierr.Field(k, "is an iptables-init command option, not a setting of the plugin")
		}
		v := bytes.TrimSpace(raw[k])
		if flags.IsBool(k) {
			var b bool
			if err := json.Unmarshal(v, &b); err != nil {
				return nil, cnierr.Field(k, "expected true or false, got %s", v)
			}
			args = append(args, fmt.Sprintf("--%s=%t", k, b))
			continue
		}
		s, err := scalarOrList(v)
		if err != nil {
			return nil, cnierr.Field(k, "%v", err)
		}
		args = append(args, fmt.Sprintf("--%s=%s", k, s))
	}
	return args, nil
}

func scalarOrList(v json.RawMessage) (string, error) {
	if len(v) > 0 && v[0] == '[' {
		var items []json.RawMessage
		if err := json.Unmarshal(v, &items); err != nil {
			return "", fmt.Errorf("expected a string, a number or a list of them, got %s", v)
		}
		var parts []string
		for _, it := range items {
			s, err := scalar(it)
			if err != nil {
				return "", err
			}
			parts = append(parts, s)
		}
		return strings.Join(parts, ","), nil
	}
	return scalar(v)
}

func scalar(v json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(v, &s); err == nil {
		return s, nil
	}
	var n json.Number
	d := json.NewDecoder(bytes.NewReader(v))
	d.UseNumber()
	if err := d.Decode(&n); err == nil {
		return n.String(), nil
	}
	return "", fmt.Errorf("expected a string, a number or a list of them, got %s", v)
}

// dnsServers are the nameservers --redirect-dns captures (when not all DNS
// is): those the interface plugins returned in prevResult.
func dnsServers(prev *current.Result) []netip.Addr {
	var out []netip.Addr
	if prev == nil {
		return nil
	}
	for _, s := range prev.DNS.Nameservers {
		if a, err := netip.ParseAddr(s); err == nil {
			out = append(out, a.Unmap())
		}
	}
	return out
}
