// Package proxylog is the log format of meshwire's transparent test proxy
// (test/proxy): one JSON object per line on its stdout, read by the
// interception tests, benchmarks and `meshwire demo`.
package proxylog

// Record is what the proxy prints for each connection or DNS query.
type Record struct {
	Event    string `json:"event"`              // "ready", "conn", "dns", "error", "sync"; with -zds also "add" and "del" (a workload's listeners opened, closed), "held" (a workload added again, kept as it was) and "snapshot" (the agent's snapshot ended: it is connected and has sent every pod it enrolls)
	Listener string `json:"listener,omitempty"` // "outbound", "inbound", "dns-tcp", "dns-udp"; with -zds also "hbone"
	Src      string `json:"src,omitempty"`
	OrigDst  string `json:"orig_dst,omitempty"`
	UID      int    `json:"uid"`
	Err      string `json:"err,omitempty"`
	// Workload is the uid of the pod whose netns the listener is in, as
	// the node agent handed it over ZDS (-zds only).
	Workload string `json:"workload,omitempty"`
}
