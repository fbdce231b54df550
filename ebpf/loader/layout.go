package loader

import "path/filepath"

// The pinned objects of each program, by layout version: a program or map
// change that an older meshwire could not read bumps the version, and
// every version's pins go in a directory of their own under the program's
// root (OtherLayout finds another version's). Nodes upgrade in place with
// pins present: these paths and names never change within a version.

// The fast path's (package fastpath, podpolicy).
//
// v2: mw_pods, and 64-bit read counts in mw_readers.
const (
	FastpathLayoutVersion = "v2"
	// FastpathRoot is the directory, under bpffs, of every layout's pins.
	FastpathRoot = BPFFS + "/meshwire"
	// FastpathPinDir is where the fast path of this layout is pinned.
	FastpathPinDir = FastpathRoot + "/" + FastpathLayoutVersion
	// PinPolicies is mw_pods' pin under the fast path's pin directory.
	PinPolicies = "pods"
)

// RulesDir is where, under the fast path's pin directory dir
// (FastpathPinDir when empty), the maps that mirror the meshed pods'
// interception settings are pinned: package pods writes and removes a
// pod's there as it does ebpf interception's (the intercept plugin, beside
// the policy), and the fast path tracks only the connections they capture.
func RulesDir(dir string) string {
	if dir == "" {
		dir = FastpathPinDir
	}
	return filepath.Join(dir, "rules")
}

// Ebpf interception's (package capture, pods).
//
// v2: struct pod_capture gained netns_ino.
const (
	CaptureLayoutVersion = "v2"
	// CaptureRoot holds the pin directories of every layout version.
	CaptureRoot = FastpathRoot + "/capture"
	// CapturePinDir is where the programs of this layout are pinned.
	CapturePinDir = CaptureRoot + "/" + CaptureLayoutVersion
)

// Names of ebpf interception's pins under its pin directory; the first
// three (a pod's settings) are also the fast path's copies under RulesDir.
const (
	PinPods     = "pods"
	PinPorts    = "ports"
	PinCIDRs    = "cidrs"
	PinOrigDst  = "origdst"
	PinCounters = "counters"
	PinIngress  = "ingress" // the tc program each pod's interfaces run
	// PinDNSHook is recvmsg4's link: attached by builds that capture DNS
	// (an older build's programs, still attached, would not).
	PinDNSHook = "recvmsg4_link"
)
