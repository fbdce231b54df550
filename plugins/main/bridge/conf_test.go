package main

import (
	"testing"

	"github.com/meshwire/meshwire/internal/podveth/podvethtest"
)

// TestConfExamples: every bridge plugin config in conf/bridge*.conflist is valid.
func TestConfExamples(t *testing.T) {
	confs, err := podvethtest.ExampleConfigs("../../../conf/bridge*.conflist", pluginType)
	if err != nil || len(confs) == 0 {
		t.Fatalf("examples: %v (%d configs)", err, len(confs))
	}
	for _, c := range confs {
		if _, err := parseConfig(c, ""); err != nil {
			t.Errorf("%s: %v", c, err)
		}
	}
}
