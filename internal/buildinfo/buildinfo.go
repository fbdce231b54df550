// Package buildinfo carries the version stamped into every meshwire binary at
// link time (see the Makefile's LDFLAGS).
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set with -ldflags "-X github.com/meshwire/meshwire/internal/buildinfo.Version=...".
var (
	Version = ""
	Commit  = ""
)

// version falls back to the module version recorded by the Go toolchain when
// the binary was built without the Makefile (go install, go build).
func version() string {
	if Version != "" {
		return Version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

func commit() string {
	if Commit != "" {
		return Commit
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return s.Value[:12]
			}
		}
	}
	return "unknown"
}

// String names meshwire, the component and its version, e.g.
// "meshwire loopback 0.1.0 (commit 1a2b3c4d5e6f, go1.26.8)".
func String(component string) string {
	return fmt.Sprintf("meshwire %s %s (commit %s, %s)", component, version(), commit(), runtime.Version())
}

// VersionCommit returns the version and the commit String reports.
func VersionCommit() (v, c string) { return version(), commit() }
