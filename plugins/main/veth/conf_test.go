package main

import (
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

// TestConfExamples: every veth plugin config in conf/veth*.conflist is
// valid.
func TestConfExamples(t *testing.T) {
	files, _ := filepath.Glob("../../../conf/veth*.conflist")
	if len(files) == 0 {
		t.Fatal("no conf/veth*.conflist")
	}
	for _, f := range files {
		l, err := libcni.ConfListFromFile(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, p := range l.Plugins {
			if p.Network.Type != pluginType {
				continue
			}
			conf, err := libcni.InjectConf(p, map[string]any{"cniVersion": l.CNIVersion, "name": l.Name})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := parseConfig(conf.Bytes, ""); err != nil {
				t.Errorf("%s: %v", f, err)
			}
		}
	}
}
