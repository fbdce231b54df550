package main

import (
	"testing"

	"github.com/meshwire/meshwire/internal/podveth/podvethtest"
)

// TestConfExamples: every veth plugin config in conf/veth*.conflist is valid.
func TestConfExamples(t *testing.T) {
	confs, err := podvethtest.ExampleConfigs("../../../conf/veth*.conflist", pluginType)
	if err != nil || len(confs) == 0 {
		t.Fatalf("examples: %v (%d configs)", err, len(confs))
	}
	for _, c := range confs {
		if _, err := parseConfig(c, ""); err != nil {
			t.Errorf("%s: %v", c, err)
		}
	}
}
