// Package podvethtest helps the veth-based plugins' tests: it is imported
// by tests only, so the plugin binaries do not carry libcni.
package podvethtest

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/meshwire/meshwire/internal/cnierr"
)

// ExampleConfigs returns, from the conflists matching glob (the project's
// conf/ examples), each config of a plugin of type pluginType as the runtime
// would pass it (cniVersion and name injected): the plugins' tests check the
// examples stay valid.
func ExampleConfigs(glob, pluginType string) ([][]byte, error) {
	files, err := filepath.Glob(glob)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no file matches %s", glob)
	}
	var out [][]byte
	for _, f := range files {
		l, err := libcni.ConfListFromFile(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		for _, p := range l.Plugins {
			if p.Network.Type != pluginType {
				continue
			}
			conf, err := libcni.InjectConf(p, map[string]any{"cniVersion": l.CNIVersion, "name": l.Name})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f, err)
			}
			out = append(out, conf.Bytes)
		}
	}
	return out, nil
}

// FuzzParseConfig seeds f with configs of pluginType (every shared key, a
// MAC from each source, broken shapes) and checks that parse, given the
// config and CNI_ARGS, either succeeds or fails with code 6 or 7: never a
// panic, never another code.
func FuzzParseConfig(f *testing.F, pluginType string, parse func(data []byte, cniArgs string) error) {
	for _, s := range []string{
		`{"cniVersion":"1.1.0","name":"n","type":"%s","ipam":{"type":"host-local"}}`,
		`{"cniVersion":"1.1.0","name":"n","type":"%s","bridge":"br0","vlan":5,"vlanTrunk":[{"minID":1,"maxID":3},{"id":9}],"ipMasq":true,"ipMasqBackend":"nftables","mtu":1400,"ipam":{"type":"host-local"}}`,
		`{"cniVersion":"1.1.0","name":"n","type":"%s","runtimeConfig":{"mac":"02:00:00:00:00:01"},"args":{"cni":{"mac":"x"}},"ipam":{"type":"host-local"}}`,
		`{"type":"%s","vlanTrunk":[null]}`,
		`{"cniVersion":"1.1.0","name":"n","type":"%s","ipMasq":true,"ipam":{"type":"host-local"},"prevResult":{"cniVersion":"1.1.0","interfaces":[null],"ips":[{"address":"198.18.0.2/24","interface":3}],"routes":[null]}}`,
		`{"cniVersion":"0.4.0","name":"n","type":"%s","ipam":{"type":"host-local"},"prevResult":{"cniVersion":"0.4.0","interfaces":[{"name":"eth0"}],"ips":[null]}}`,
	} {
		f.Add([]byte(fmt.Sprintf(s, pluginType)), "MAC=02:00:00:00:00:02")
	}
	for _, s := range []string{`[]`, ``, `{"type":5}`} {
		f.Add([]byte(s), "MAC=02:00:00:00:00:02")
	}
	f.Fuzz(func(t *testing.T, data []byte, env string) {
		err := parse(data, env)
		if err == nil {
			return
		}
		if c := cnierr.Code(err); c != cnierr.CodeDecoding && c != cnierr.CodeInvalidConfig {
			t.Fatalf("code %d for %q: %v", c, data, err)
		}
	})
}
