// Package proxylog is the log format of meshwire's transparent test proxy
// (test/proxy): one JSON object per line on its stdout, read by the
// interception tests, benchmarks and `meshwire demo`.
package proxylog

// Record is what the proxy prints for each connection or DNS query.
type Record struct {
	Event    string `json:"event"`              // "ready", "conn", "dns", "error", "sync"
	Listener string `json:"listener,omitempty"` // "outbound", "inbound", "dns-tcp", "dns-udp"
	Src      string `json:"src,omitempty"`
	OrigDst  string `json:"orig_dst,omitempty"`
	UID      int    `json:"uid"`
	Err      string `json:"err,omitempty"`
}
