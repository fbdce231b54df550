package framework

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// FortioResult is what the suites read of the result `fortio load -json -`
// prints (fortio v1.67.1, build.sh fortio).
type FortioResult struct {
	StartTime      time.Time
	ActualDuration time.Duration // nanoseconds in the JSON
	ActualQPS      float64
	// RetCodes counts the answers by HTTP status; -1 counts the requests
	// that got none (a connection refused, reset or timed out).
	RetCodes          map[int]int64
	DurationHistogram struct {
		Count int64
		// Percentiles are the percentiles fortio was asked for (-p),
		// in seconds, interpolated within its histogram's buckets
		// (their width is set by -r).
		Percentiles []struct{ Percentile, Value float64 }
	}
	// SocketCount is how many connections fortio opened: 1 per thread
	// while its keep-alive connection holds.
	SocketCount int
}

// Requests is how many requests fortio sent.
func (r *FortioResult) Requests() int64 { return r.DurationHistogram.Count }

// Failed is how many requests got no 200: another status, or none.
func (r *FortioResult) Failed() int64 { return r.Requests() - r.RetCodes[200] }

// Percentile is the p-th percentile of the requests' durations in
// seconds, as fortio reported it; false when it was not asked for (-p).
func (r *FortioResult) Percentile(p float64) (float64, bool) {
	for _, x := range r.DurationHistogram.Percentiles {
		if x.Percentile == p {
			return x.Value, true
		}
	}
	return 0, false
}

// End is when the load ended.
func (r *FortioResult) End() time.Time { return r.StartTime.Add(r.ActualDuration) }

// ParseFortio reads fortio's result from a container's log, where its own
// log lines (standard error, one JSON object or a sentence each) come
// before the result (standard output), an indented JSON object whose
// first line is "{".
func ParseFortio(log string) (*FortioResult, error) {
	i := strings.Index(log, "\n{\n")
	if i < 0 {
		if !strings.HasPrefix(log, "{\n") {
			return nil, fmt.Errorf("no fortio result in the log (%d bytes)", len(log))
		}
	} else {
		log = log[i+1:]
	}
	var r FortioResult
	if err := json.NewDecoder(strings.NewReader(log)).Decode(&r); err != nil {
		return nil, fmt.Errorf("fortio's result: %w", err)
	}
	if r.StartTime.IsZero() {
		return nil, fmt.Errorf("fortio's result has no StartTime")
	}
	return &r, nil
}
