package main

import (
	"testing"

	"github.com/meshwire/meshwire/internal/podveth/podvethtest"
)

// FuzzParseConfig: any input either decodes or fails with code 6 or 7 (never
// a panic, never another code).
func FuzzParseConfig(f *testing.F) {
	podvethtest.FuzzParseConfig(f, "bridge", func(data []byte, cniArgs string) error {
		_, err := parseConfig(data, cniArgs)
		return err
	})
}
