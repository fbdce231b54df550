package nodeagent

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/meshwire/meshwire/internal/installer"
)

// parse reads an exposition with Prometheus' own parser.
func parse(t *testing.T, text []byte) map[string]*dto.MetricFamily {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		t.Fatalf("Prometheus cannot parse the exposition: %v\n%s", err, text)
	}
	return fams
}

// value returns the value of the sample of family name whose labels are
// labels (name, value pairs); ok is false when there is none.
func value(fams map[string]*dto.MetricFamily, name string, labels ...string) (v float64, ok bool) {
	f := fams[name]
	if f == nil {
		return 0, false
	}
next:
	for _, m := range f.Metric {
		if len(m.Label) != len(labels)/2 {
			continue
		}
		for i, l := range m.Label {
			if l.GetName() != labels[2*i] || l.GetValue() != labels[2*i+1] {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.Counter.GetValue(), true
		case m.Gauge != nil:
			return m.Gauge.GetValue(), true
		}
	}
	return 0, false
}

// TestExposition: what the writer makes parses as Prometheus text, with
// escaped help and label values and the special float values.
func TestExposition(t *testing.T) {
	var e exposition
	e.family("x_total", "counter", "a help with a \\ and a\nnewline")
	e.sample("x_total", 3, "a", `quote " backslash \ newline`+"\n", "b", "")
	e.sample("x_total", 1.5e300, "a", "big", "b", "")
	e.family("y", "gauge", "y")
	e.sample("y", math.Inf(1))
	fams := parse(t, e.b.Bytes())
	if got := fams["x_total"].GetHelp(); got != "a help with a \\ and a\nnewline" {
		t.Errorf("help %q", got)
	}
	if v, ok := value(fams, "x_total", "a", `quote " backslash \ newline`+"\n", "b", ""); !ok || v != 3 {
		t.Errorf("escaped label: %v %v\n%s", v, ok, e.b.String())
	}
	if v, _ := value(fams, "x_total", "a", "big", "b", ""); v != 1.5e300 {
		t.Errorf("big value %v", v)
	}
	if v, _ := value(fams, "y"); !math.IsInf(v, 1) {
		t.Errorf("+Inf read as %v", v)
	}
}

// logLine is one record as package logging writes it for a plugin call.
func logLine(plugin, cmd, msg string, code int, ms float64) string {
	switch msg {
	case "failed":
		return fmt.Sprintf(`{"time":"2026-11-25T07:00:00Z","level":"WARN","msg":"failed","plugin":%q,"command":%q,"containerID":"c","netns":"/n","ifname":"eth0","durationMs":%g,"code":%d,"error":"e"}`+"\n", plugin, cmd, ms, code)
	case "panic":
		return fmt.Sprintf(`{"time":"2026-11-25T07:00:00Z","level":"ERROR","msg":"panic","plugin":%q,"command":%q,"panic":"x","stack":"s"}`+"\n", plugin, cmd)
	}
	return fmt.Sprintf(`{"time":"2026-11-25T07:00:00Z","level":"INFO","msg":%q,"plugin":%q,"command":%q,"durationMs":%g}`+"\n", msg, plugin, cmd, ms)
}

func appendTo(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

func scrapeLog(t *testing.T, p *pluginLog) map[string]*dto.MetricFamily {
	t.Helper()
	p.read()
	if err := p.err(); err != nil {
		t.Fatal(err)
	}
	var e exposition
	p.write(&e)
	return parse(t, e.b.Bytes())
}

// TestPluginLog: calls, errors by code, panics, durations; a line written
// in two pieces counts once, when finished; lines that are not call
// records are counted apart; a rotated or truncated file starts over; past
// the size limit the agent rotates the file itself.
func TestPluginLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cni.log")
	p := newPluginLog(path, 4096)
	if fams := scrapeLog(t, p); len(fams["meshwire_cni_calls_total"].GetMetric()) != 0 {
		t.Fatal("calls counted before the log exists")
	}
	appendTo(t, path, logLine("bridge", "ADD", "done", 0, 12.5)+
		logLine("bridge", "ADD", "done", 0, 7.5)+
		logLine("bridge", "ADD", "start", 0, 0)+
		logLine("portmap", "ADD", "failed", 7, 1)+
		logLine("bandwidth", "DEL", "panic", 0, 0)+
		logLine("bandwidth", "DEL", "failed", 999, 2)+
		"not json\n"+`{"msg":"done"}`+"\n")
	half := logLine("bridge", "DEL", "done", 0, 3)
	appendTo(t, path, half[:20])
	fams := scrapeLog(t, p)
	for _, c := range []struct {
		name   string
		want   float64
		labels []string
	}{
		{"meshwire_cni_calls_total", 2, []string{"plugin", "bridge", "command", "ADD", "result", "ok"}},
		{"meshwire_cni_call_seconds_total", 0.02, []string{"plugin", "bridge", "command", "ADD", "result", "ok"}},
		{"meshwire_cni_calls_total", 1, []string{"plugin", "portmap", "command", "ADD", "result", "error"}},
		{"meshwire_cni_errors_total", 1, []string{"plugin", "portmap", "command", "ADD", "code", "7"}},
		{"meshwire_cni_errors_total", 1, []string{"plugin", "bandwidth", "command", "DEL", "code", "999"}},
		{"meshwire_cni_panics_total", 1, []string{"plugin", "bandwidth"}},
		{"meshwire_cni_log_unparsed_lines_total", 2, nil},
	} {
		if v, ok := value(fams, c.name, c.labels...); !ok || math.Abs(v-c.want) > 1e-9 {
			t.Errorf("%s%v = %v (found %v), want %v", c.name, c.labels, v, ok, c.want)
		}
	}
	if _, ok := value(fams, "meshwire_cni_calls_total", "plugin", "bridge", "command", "DEL", "result", "ok"); ok {
		t.Error("half a line counted")
	}
	appendTo(t, path, half[20:])
	if v, _ := value(scrapeLog(t, p), "meshwire_cni_calls_total", "plugin", "bridge", "command", "DEL", "result", "ok"); v != 1 {
		t.Errorf("the finished line counted %v times", v)
	}

	// Truncated by hand: read from the start again.
	if err := os.Truncate(path, 0); err != nil {
		t.Fatal(err)
	}
	appendTo(t, path, logLine("veth", "ADD", "done", 0, 1))
	if v, _ := value(scrapeLog(t, p), "meshwire_cni_calls_total", "plugin", "veth", "command", "ADD", "result", "ok"); v != 1 {
		t.Errorf("after truncation: %v", v)
	}
	// Past the size limit the agent moves the file to .1 once read.
	for range 40 {
		appendTo(t, path, logLine("veth", "ADD", "done", 0, 1))
	}
	if v, _ := value(scrapeLog(t, p), "meshwire_cni_calls_total", "plugin", "veth", "command", "ADD", "result", "ok"); v != 41 {
		t.Errorf("before rotation: %v", v)
	}
	if _, err := os.Stat(path + ".1"); err != nil {
		t.Fatalf("not rotated at %d bytes: %v", p.maxSize, err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("the log is still there after rotation: %v", err)
	}
	appendTo(t, path, logLine("veth", "ADD", "done", 0, 1))
	if v, _ := value(scrapeLog(t, p), "meshwire_cni_calls_total", "plugin", "veth", "command", "ADD", "result", "ok"); v != 42 {
		t.Errorf("after rotation: %v", v)
	}
}

// testAgent makes an agent on temporary CNI directories, without the fast
// path; flannel's config is there when withConf.
func testAgent(t *testing.T, withConf bool, listen string) (*Agent, string) {
	t.Helper()
	src, bin, conf := t.TempDir(), t.TempDir(), t.TempDir()
	for _, b := range installer.Binaries() {
		if err := os.WriteFile(filepath.Join(src, b.Source), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if withConf {
		c := `{"cniVersion":"1.0.0","name":"cbr0","plugins":[{"type":"flannel"}]}`
		if err := os.WriteFile(filepath.Join(conf, "10-flannel.conflist"), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	a, err := New(Options{
		Install:  installer.Options{BinDir: bin, ConfDir: conf, SourceDir: src, Chain: true, CleanupOnExit: true, PluginLog: filepath.Join(t.TempDir(), "cni.log"), Resync: 100 * time.Millisecond},
		Listen:   listen,
		Interval: 50 * time.Millisecond,
		StateDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return a, conf
}

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	return rec.Code, rec.Body.String()
}

// TestProbes: /readyz says why the node is not ready (nothing installed,
// no config to chain into) and turns ready once the config is applied;
// /healthz fails when the loop stops going round; /metrics follows.
func TestProbes(t *testing.T) {
	a, conf := testAgent(t, false, "127.0.0.1:0")
	h := a.Handler()
	if code, body := get(t, h, "/readyz"); code != 503 || !strings.Contains(body, "plugins not installed yet") {
		t.Fatalf("before anything: %d %q", code, body)
	}
	if code, _ := get(t, h, "/healthz"); code != 503 {
		t.Fatalf("healthz before the loop ran: %d", code)
	}
	a.tick()
	if code, body := get(t, h, "/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("healthz after a round: %d %q", code, body)
	}
	if err := a.in.InstallBinaries(); err != nil {
		t.Fatal(err)
	}
	_ = a.in.Apply()
	if code, body := get(t, h, "/readyz"); code != 503 || !strings.Contains(body, "config not applied: no CNI config in "+conf) {
		t.Fatalf("with no config to chain into: %d %q", code, body)
	}
	_, text := get(t, h, "/metrics")
	fams := parse(t, []byte(text))
	for name, want := range map[string]float64{"meshwire_node_ready": 0, "meshwire_installer_binaries_installed": 1, "meshwire_installer_config_applied": 0, "meshwire_installer_apply_failures_total": 1, "meshwire_fastpath_managed": 0} {
		if v, ok := value(fams, name); !ok || v != want {
			t.Errorf("%s = %v (found %v), want %v", name, v, ok, want)
		}
	}
	if err := os.WriteFile(filepath.Join(conf, "10-flannel.conflist"), []byte(`{"cniVersion":"1.0.0","name":"cbr0","plugins":[{"type":"flannel"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := a.in.Apply(); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, h, "/readyz"); code != 200 || body != "ready\n" {
		t.Fatalf("once applied: %d %q", code, body)
	}
	a.beat.Store(time.Now().Add(-a.stale() - time.Second).UnixNano())
	if code, body := get(t, h, "/healthz"); code != 503 || !strings.Contains(body, "loop last ran") {
		t.Fatalf("healthz with a stalled loop: %d %q", code, body)
	}
}

// TestRun: Run serves the endpoints on the address, becomes ready, and
// when its context ends takes the config change back and stops serving.
func TestRun(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	a, conf := testAgent(t, true, addr)
	orig, _ := os.ReadFile(filepath.Join(conf, "10-flannel.conflist"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	ready := false
	for end := time.Now().Add(5 * time.Second); !ready && time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if resp, err := http.Get("http://" + addr + "/readyz"); err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			ready = resp.StatusCode == 200 && string(b) == "ready\n"
		}
	}
	if !ready {
		t.Fatal("not ready within 5s")
	}
	if b, _ := os.ReadFile(filepath.Join(conf, "10-flannel.conflist")); !installer.HasMarker(b) {
		t.Fatalf("config not chained: %s", b)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s of its context ending")
	}
	if b, _ := os.ReadFile(filepath.Join(conf, "10-flannel.conflist")); !bytes.Equal(b, orig) {
		t.Fatalf("config not restored:\n%s", b)
	}
	if _, err := http.Get("http://" + addr + "/healthz"); err == nil {
		t.Fatal("still serving after Run returned")
	}
}
