package framework

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// AuditLogs are the API server's audit log files of the running cluster
// (cluster.sh up writes logs/audit.log in the state directory, Metadata
// level; rotated files beside it), oldest first.
func (c *Cluster) AuditLogs() ([]string, error) {
	files, err := filepath.Glob(filepath.Join(c.State, "logs", "audit*.log"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no audit log in %s (cluster.sh up starts kube-apiserver with --audit-log-path)", filepath.Join(c.State, "logs"))
	}
	sort.Strings(files) // audit-TIMESTAMP.log (rotated) before audit.log
	return files, nil
}

// AuditKey is who made a request: the program its user agent names (the
// user agent up to its first "/": "kubelet", "istio-cni",
// "kube-scheduler") and the user the API server authenticated.
type AuditKey struct {
	Program string `json:"program"`
	User    string `json:"user"`
}

// AuditCounts are the requests of each caller, and of each caller by verb
// and resource ("get pods", "patch pods/status").
type AuditCounts struct {
	Requests map[AuditKey]int            `json:"-"`
	Calls    map[AuditKey]map[string]int `json:"-"`
}

// Total is the number of requests of every caller key matches.
func (a AuditCounts) Total(match func(AuditKey) bool) int {
	n := 0
	for k, v := range a.Requests {
		if match(k) {
			n += v
		}
	}
	return n
}

// Add is a and b's requests together.
func (a AuditCounts) Add(b AuditCounts) AuditCounts {
	out := AuditCounts{Requests: map[AuditKey]int{}, Calls: map[AuditKey]map[string]int{}}
	for _, x := range []AuditCounts{a, b} {
		for k, v := range x.Requests {
			out.Requests[k] += v
		}
		for k, m := range x.Calls {
			if out.Calls[k] == nil {
				out.Calls[k] = map[string]int{}
			}
			for c, v := range m {
				out.Calls[k][c] += v
			}
		}
	}
	return out
}

// auditEvent is what CountAudit reads of an audit.k8s.io/v1 Event.
type auditEvent struct {
	AuditID   string `json:"auditID"`
	Verb      string `json:"verb"`
	UserAgent string `json:"userAgent"`
	User      struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	RequestURI string    `json:"requestURI"`
	Received   time.Time `json:"requestReceivedTimestamp"`
}

// UserAgentProgram is the program a user agent names: client-go's default
// agent is "PROGRAM/VERSION (OS/ARCH) kubernetes/COMMIT", PROGRAM the
// base name of the binary that made the client.
func UserAgentProgram(ua string) string {
	if i := strings.IndexAny(ua, "/ "); i >= 0 {
		ua = ua[:i]
	}
	if ua == "" {
		return "(none)"
	}
	return ua
}

// CountAudit counts the requests of the audit logs r that the API server
// received in one of windows, by caller and by verb and resource. A
// request is counted once whatever the stages it was logged at (its
// auditID); lines that are not events are an error.
func CountAudit(r io.Reader, windows []Window) (AuditCounts, error) {
	out := AuditCounts{Requests: map[AuditKey]int{}, Calls: map[AuditKey]map[string]int{}}
	seen := map[string]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Bytes()
		if len(strings.TrimSpace(string(line))) == 0 {
			continue
		}
		var e auditEvent
		if err := json.Unmarshal(line, &e); err != nil {
			return out, fmt.Errorf("audit log line %d: %w", n, err)
		}
		if seen[e.AuditID] || !InWindows(windows, e.Received) {
			continue
		}
		seen[e.AuditID] = true
		k := AuditKey{Program: UserAgentProgram(e.UserAgent), User: e.User.Username}
		out.Requests[k]++
		call := e.Verb + " " + e.RequestURI
		if e.ObjectRef != nil {
			call = e.Verb + " " + e.ObjectRef.Resource
			if e.ObjectRef.Subresource != "" {
				call += "/" + e.ObjectRef.Subresource
			}
		}
		if out.Calls[k] == nil {
			out.Calls[k] = map[string]int{}
		}
		out.Calls[k][call]++
	}
	return out, sc.Err()
}

// CountAuditFiles is CountAudit over files, one after the other.
func CountAuditFiles(files []string, windows []Window) (AuditCounts, error) {
	out := AuditCounts{Requests: map[AuditKey]int{}, Calls: map[AuditKey]map[string]int{}}
	for _, f := range files {
		fh, err := os.Open(f)
		if err != nil {
			return out, err
		}
		c, err := CountAudit(fh, windows)
		fh.Close()
		if err != nil {
			return out, fmt.Errorf("%s: %w", f, err)
		}
		out = out.Add(c)
	}
	return out, nil
}

// AuditTable is a's requests per pod (pods started in the windows
// counted), one row per caller, most requests first, with each caller's
// calls; mark names the callers judged (marked "judged").
func AuditTable(a AuditCounts, pods int, mark func(AuditKey) bool) string {
	keys := make([]AuditKey, 0, len(a.Requests))
	for k := range a.Requests {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if a.Requests[keys[i]] != a.Requests[keys[j]] {
			return a.Requests[keys[i]] > a.Requests[keys[j]]
		}
		return keys[i].Program+keys[i].User < keys[j].Program+keys[j].User
	})
	var b strings.Builder
	fmt.Fprintf(&b, "| user agent | user | requests | per pod (%d pods) | calls |\n|---|---|---|---|---|\n", pods)
	total := 0
	for _, k := range keys {
		n := a.Requests[k]
		total += n
		names := make([]string, 0, len(a.Calls[k]))
		for c := range a.Calls[k] {
			names = append(names, c)
		}
		sort.Slice(names, func(i, j int) bool {
			ci, cj := a.Calls[k][names[i]], a.Calls[k][names[j]]
			return ci > cj || ci == cj && names[i] < names[j]
		})
		var calls []string
		for i, c := range names {
			if i == 5 {
				calls = append(calls, "...")
				break
			}
			calls = append(calls, fmt.Sprintf("%s %d", c, a.Calls[k][c]))
		}
		judged := ""
		if mark != nil && mark(k) {
			judged = " (judged)"
		}
		fmt.Fprintf(&b, "| %s%s | %s | %d | %.2f | %s |\n", k.Program, judged, k.User, n, perPod(n, pods), strings.Join(calls, ", "))
	}
	fmt.Fprintf(&b, "| all | | %d | %.2f | |\n", total, perPod(total, pods))
	return b.String()
}

func perPod(n, pods int) float64 {
	if pods == 0 {
		return 0
	}
	return float64(n) / float64(pods)
}
