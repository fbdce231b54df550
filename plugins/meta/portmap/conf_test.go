package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestExampleConflists: the portmap entries of conf/portmap*.conflist are
// valid configs.
func TestExampleConflists(t *testing.T) {
	files, _ := filepath.Glob("../../../conf/portmap*.conflist")
	if len(files) == 0 {
		t.Fatal("no conf/portmap*.conflist")
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var list struct {
			CNIVersion string            `json:"cniVersion"`
			Name       string            `json:"name"`
			Plugins    []json.RawMessage `json:"plugins"`
		}
		if err := json.Unmarshal(data, &list); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		found := false
		for _, raw := range list.Plugins {
			var p map[string]any
			if err := json.Unmarshal(raw, &p); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if p["type"] != pluginType {
				continue
			}
			found = true
			p["cniVersion"], p["name"] = list.CNIVersion, list.Name
			b, _ := json.Marshal(p)
			if _, err := parseConfig(b); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
		}
		if !found {
			t.Fatalf("%s has no portmap plugin", f)
		}
	}
}
