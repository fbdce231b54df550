// Package vethconftest helps the veth-based plugins' tests: it is imported
// by tests only, so the plugin binaries do not carry libcni.
package vethconftest

import (
	"fmt"
	"path/filepath"

	"github.com/containernetworking/cni/libcni"
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
