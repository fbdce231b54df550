// Package logtest captures what the code under test logs through
// log/slog's default logger, for tests that check a log line: the node
// agent's, the installer's, the ZDS server's.
package logtest

import (
	"log/slog"
	"testing"

	"github.com/meshwire/meshwire/internal/logging"
)

// Capture makes the default logger write to a new buffer until the test
// ends, one text line per record (slog's text handler, level debug and
// above), and returns it. Tests that capture must not run in parallel.
func Capture(t testing.TB) *logging.Buffer {
	l := &logging.Buffer{}
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(old) })
	return l
}
