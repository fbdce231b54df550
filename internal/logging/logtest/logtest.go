// Package logtest captures what the code under test logs through
// log/slog's default logger, for tests that check a log line: the node
// agent's, the installer's, the ZDS server's.
package logtest

import (
	"bytes"
	"log/slog"
	"sync"
	"testing"
)

// Buffer holds the records logged, one text line each (slog's text
// handler, level debug and above).
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is every line logged so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Capture makes the default logger write to a new Buffer until the test
// ends, and returns it. Tests that capture must not run in parallel.
func Capture(t testing.TB) *Buffer {
	l := &Buffer{}
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(old) })
	return l
}
