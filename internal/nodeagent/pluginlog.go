package nodeagent

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"slices"
	"strconv"
	"sync"
	"syscall"
)

// pluginLog follows the plugins' JSON log (package logging: one record per
// line, written by every plugin process with O_APPEND) and counts what the
// plugins did. Every plugin call ends with one record: "done", or "failed"
// with its CNI error code, after a "panic" record when it panicked.
//
// The agent also keeps the file from growing without end: once it has read
// a file of maxSize bytes or more it renames it to FILE.1 (replacing the
// previous one), and the next plugin creates a new file. A plugin that
// opened the file just before the rename finishes its record in FILE.1,
// which the agent does not read: that call is not counted.
type pluginLog struct {
	path    string
	maxSize int64

	mu      sync.Mutex
	ino     uint64
	off     int64
	partial []byte // the start of a line not finished yet
	calls   map[callKey]*callStats
	errs    map[errKey]uint64
	panics  map[string]uint64
	bad     uint64 // lines that are not records of a plugin call
	readErr error
}

type callKey struct{ plugin, command, result string }

type callStats struct {
	n       uint64
	seconds float64
}

type errKey struct {
	plugin, command string
	code            int
}

// maxRead bounds what one read takes in, so that a huge backlog is worked
// through over several reads.
const maxRead = 16 << 20

func newPluginLog(path string, maxSize int64) *pluginLog {
	return &pluginLog{path: path, maxSize: maxSize, calls: map[callKey]*callStats{}, errs: map[errKey]uint64{}, panics: map[string]uint64{}}
}

// read takes in the records appended since the last read.
func (p *pluginLog) read() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.readErr = p.readLocked()
}

func (p *pluginLog) readLocked() error {
	f, err := os.Open(p.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil // no plugin has logged yet
	}
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	var ino uint64
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		ino = sys.Ino
	}
	if ino != p.ino || st.Size() < p.off {
		// A new file (rotated, by the agent or by hand) or one cut short.
		p.ino, p.off, p.partial = ino, 0, nil
	}
	buf := make([]byte, min(st.Size()-p.off, maxRead))
	n, err := f.ReadAt(buf, p.off)
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	p.off += int64(n)
	data := append(p.partial, buf[:n]...)
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			break
		}
		p.record(data[:i])
		data = data[i+1:]
	}
	p.partial = append([]byte(nil), data...)
	if p.maxSize > 0 && p.off >= p.maxSize && p.off == st.Size() {
		if err := os.Rename(p.path, p.path+".1"); err != nil {
			return err
		}
	}
	return nil
}

// record counts one line.
func (p *pluginLog) record(line []byte) {
	var r struct {
		Msg        string   `json:"msg"`
		Plugin     string   `json:"plugin"`
		Command    string   `json:"command"`
		Code       *int     `json:"code"`
		DurationMs *float64 `json:"durationMs"`
	}
	if len(bytes.TrimSpace(line)) == 0 {
		return
	}
	if err := json.Unmarshal(line, &r); err != nil || r.Plugin == "" || r.Command == "" {
		p.bad++
		return
	}
	switch r.Msg {
	case "done", "failed":
		if r.DurationMs == nil {
			p.bad++
			return
		}
		result := "ok"
		if r.Msg == "failed" {
			result = "error"
			code := 0
			if r.Code != nil {
				code = *r.Code
			}
			p.errs[errKey{r.Plugin, r.Command, code}]++
		}
		k := callKey{r.Plugin, r.Command, result}
		s := p.calls[k]
		if s == nil {
			s = &callStats{}
			p.calls[k] = s
		}
		s.n++
		s.seconds += *r.DurationMs / 1000
	case "panic":
		p.panics[r.Plugin]++
	}
	// Other records (a plugin's own warnings, debug "start") are not
	// calls.
}

// write adds the plugin metrics to e.
func (p *pluginLog) write(e *exposition) {
	p.mu.Lock()
	defer p.mu.Unlock()
	calls := slices.SortedFunc(maps.Keys(p.calls), func(a, b callKey) int {
		return cmp.Or(cmp.Compare(a.plugin, b.plugin), cmp.Compare(a.command, b.command), cmp.Compare(a.result, b.result))
	})
	e.family("meshwire_cni_calls_total", "counter", "Plugin calls in the plugins' log, by plugin, CNI command and result (ok, error).")
	for _, k := range calls {
		e.sample("meshwire_cni_calls_total", float64(p.calls[k].n), "plugin", k.plugin, "command", k.command, "result", k.result)
	}
	e.family("meshwire_cni_call_seconds_total", "counter", "Time the plugin calls in the plugins' log took, by plugin, CNI command and result.")
	for _, k := range calls {
		e.sample("meshwire_cni_call_seconds_total", p.calls[k].seconds, "plugin", k.plugin, "command", k.command, "result", k.result)
	}
	errs := slices.SortedFunc(maps.Keys(p.errs), func(a, b errKey) int {
		return cmp.Or(cmp.Compare(a.plugin, b.plugin), cmp.Compare(a.command, b.command), cmp.Compare(a.code, b.code))
	})
	e.family("meshwire_cni_errors_total", "counter", "Failed plugin calls, by plugin, CNI command and CNI error code.")
	for _, k := range errs {
		e.sample("meshwire_cni_errors_total", float64(p.errs[k]), "plugin", k.plugin, "command", k.command, "code", strconv.Itoa(k.code))
	}
	plugins := slices.Sorted(maps.Keys(p.panics))
	e.family("meshwire_cni_panics_total", "counter", "Plugin calls that panicked (each also counts as an error with code 999).")
	for _, k := range plugins {
		e.sample("meshwire_cni_panics_total", float64(p.panics[k]), "plugin", k)
	}
	e.family("meshwire_cni_log_unparsed_lines_total", "counter", "Lines of the plugins' log that are not a plugin record.")
	e.sample("meshwire_cni_log_unparsed_lines_total", float64(p.bad))
}

// err is why the last read failed.
func (p *pluginLog) err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.readErr
}
