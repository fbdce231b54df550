package framework

import (
	"testing"
	"time"
)

// A fortio v1.67.1 container's log: its log lines, then the result (cut).
const fortioLog = `{"ts":1795913885.853243,"level":"info","r":1,"file":"scli.go","line":122,"msg":"Starting","command":"Φορτίο","version":"1.67.1"}
Fortio 1.67.1 running at 10 queries per second, 2->2 procs, for 2s: http://127.0.0.1:18080/
{"ts":1795913885.853993,"level":"info","r":1,"file":"httprunner.go","line":121,"msg":"Starting http test","run":0}
{
  "RunType": "HTTP",
  "StartTime": "2026-11-29T00:58:05.855193241Z",
  "ActualQPS": 9.966664348254428,
  "ActualDuration": 2006689430,
  "DurationHistogram": {
    "Count": 20,
    "Min": 0.000603,
    "Percentiles": [
      {"Percentile": 50, "Value": 0.00071},
      {"Percentile": 99, "Value": 0.0021}
    ]
  },
  "RetCodes": {
    "200": 18,
    "-1": 1,
    "503": 1
  },
  "SocketCount": 2
}
Successfully wrote 3567 bytes of Json data to stdout
`

func TestParseFortio(t *testing.T) {
	r, err := ParseFortio(fortioLog)
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests() != 20 || r.Failed() != 2 || r.SocketCount != 2 || r.RetCodes[-1] != 1 {
		t.Errorf("requests %d, failed %d, sockets %d, codes %v", r.Requests(), r.Failed(), r.SocketCount, r.RetCodes)
	}
	if want := time.Date(2026, 11, 29, 0, 58, 7, 861882671, time.UTC); !r.End().Equal(want) {
		t.Errorf("end %s, want %s", r.End(), want)
	}
	if p, ok := r.Percentile(99); !ok || p != 0.0021 {
		t.Errorf("p99 %v (%v), want 0.0021", p, ok)
	}
	if _, ok := r.Percentile(90); ok {
		t.Error("p90, which fortio did not report, found")
	}
	if _, err := ParseFortio("no result here\n"); err == nil {
		t.Error("a log without a result parsed")
	}
}
