package framework

import (
	"bufio"
	"encoding/json"
	"io"
	"strings"
	"time"
)

// A chained plugin's own ADD time, from its own log on the node.

// InterceptAddTimes reads meshwire's plugin log (JSON lines, as
// internal/cniplugin writes them: every command ends with a "done" record
// carrying durationMs, from the plugin's entry to its result): the ADDs of
// the intercept plugin that installed a pod's interception rules
// ("interception rules installed", same containerID) and ended in one of
// windows, each one's durationMs by sandbox (containerID).
func InterceptAddTimes(r io.Reader, windows []Window) (map[string]float64, error) {
	out := map[string]float64{}
	installed := map[string]bool{}
	err := jsonLines(r, func(line []byte) {
		var rec struct {
			Time        time.Time `json:"time"`
			Msg         string    `json:"msg"`
			Plugin      string    `json:"plugin"`
			Command     string    `json:"command"`
			ContainerID string    `json:"containerID"`
			DurationMs  *float64  `json:"durationMs"`
		}
		if json.Unmarshal(line, &rec) != nil || rec.Plugin != "intercept" || rec.Command != "ADD" {
			return
		}
		switch rec.Msg {
		case "interception rules installed":
			installed[rec.ContainerID] = true
		case "done":
			if installed[rec.ContainerID] && rec.DurationMs != nil && InWindows(windows, rec.Time) {
				out[rec.ContainerID] = *rec.DurationMs
			}
			delete(installed, rec.ContainerID)
		}
	})
	return out, err
}

// IstioCNI's plugin (istio.io/istio cni/pkg/plugin) logs, around its
// programming of a pod's rules (iptables.Program), these two lines at info
// level, its default; the lines before them (the kube client, the pod's
// GET) are at debug level.
const (
	istioStart = "============= Start iptables configuration for "
	istioEnd   = "============= End iptables configuration for "
)

// IstioCNIAddTimes reads istio-cni's plugin log (zap JSON lines: level,
// time, msg; the node's /var/run/istio-cni/istio-cni.log, or the lines
// its agent relays): for each pod whose "Start iptables configuration"
// and "End iptables configuration" lines both lie in one of windows, the
// time between them in ms, by pod name. That is the part of istio-cni's
// ADD it logs at its default level: its Kubernetes client, the pod's GET
// and its process start lie before it, its result after.
func IstioCNIAddTimes(r io.Reader, windows []Window) (map[string]float64, error) {
	out := map[string]float64{}
	start := map[string]time.Time{}
	err := jsonLines(r, func(line []byte) {
		var rec struct {
			Time time.Time `json:"time"`
			Msg  string    `json:"msg"`
		}
		if json.Unmarshal(line, &rec) != nil || !InWindows(windows, rec.Time) {
			return
		}
		switch {
		case strings.HasPrefix(rec.Msg, istioStart):
			start[istioPod(rec.Msg, istioStart)] = rec.Time
		case strings.HasPrefix(rec.Msg, istioEnd):
			pod := istioPod(rec.Msg, istioEnd)
			if t0, ok := start[pod]; ok {
				out[pod] = float64(rec.Time.Sub(t0).Microseconds()) / 1000
				delete(start, pod)
			}
		}
	})
	return out, err
}

func istioPod(msg, prefix string) string {
	return strings.TrimSpace(strings.TrimSuffix(strings.TrimPrefix(msg, prefix), "============="))
}

// jsonLines calls fn with each line of r that looks like a JSON object.
func jsonLines(r io.Reader, fn func([]byte)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		if b := sc.Bytes(); len(b) > 0 && b[0] == '{' {
			fn(b)
		}
	}
	return sc.Err()
}

// Values is m's values.
func Values(m map[string]float64) []float64 {
	out := make([]float64, 0, len(m))
	for _, v := range m {
		out = append(out, v)
	}
	return out
}
