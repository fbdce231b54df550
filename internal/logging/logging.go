// Package logging gives meshwire binaries their structured log
// (log/slog), with the same keys everywhere (KeyPod, KeyNetns,
// KeyContainerID).
//
// Plugins must never write logs to stdout, which carries the CNI result. A
// plugin's log is off unless its config has a "log" object or the
// MESHWIRE_LOG environment variable names a file; then records are
// appended to that file as JSON lines, one line per record so that
// plugins running in parallel never interleave within a record (Open).
// The long-running commands (the node agent, the installer) log to their
// standard error, as text or JSON (NewCommand).
package logging

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/meshwire/meshwire/internal/nodelayout"
)

// Config is the "log" object of a plugin config:
//
//	"log": {"file": "/var/log/meshwire/cni.log", "level": "debug"}
type Config struct {
	File  string `json:"file,omitempty"`
	Level string `json:"level,omitempty"`
}

// Environment variables that turn the log on when the config does not.
const (
	EnvFile  = nodelayout.EnvPluginLog      // path of the log file
	EnvLevel = nodelayout.EnvPluginLogLevel // debug, info (default), warn, error
)

// The keys that name a pod in every meshwire log: the plugins' records
// carry KeyContainerID and KeyNetns of the attachment they work on, the
// node agent's name the pod too (namespace/name).
const (
	KeyPod         = "pod"
	KeyNetns       = "netns"
	KeyContainerID = "containerID"
)

// Formats of a command's log (NewCommand).
const (
	FormatText = "text"
	FormatJSON = "json"
)

// NewCommand returns the log of a long-running command, written to w in
// format (FormatText when empty, or FormatJSON) from level up.
func NewCommand(w io.Writer, format, level string) (*slog.Logger, error) {
	lvl, err := ParseLevel(level)
	if err != nil {
		return nil, err
	}
	o := &slog.HandlerOptions{Level: lvl}
	switch strings.ToLower(format) {
	case "", FormatText:
		return slog.New(slog.NewTextHandler(w, o)), nil
	case FormatJSON:
		return slog.New(slog.NewJSONHandler(w, o)), nil
	}
	return nil, fmt.Errorf("unknown log format %q (want %s or %s)", format, FormatText, FormatJSON)
}

// ParseLevel maps a level name to a slog level; empty means info.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "info":
		return slog.LevelInfo, nil
	case "debug":
		return slog.LevelDebug, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("unknown level %q (want debug, info, warn or error)", s)
}

// FieldError names the key of the log object that is wrong.
type FieldError struct{ Field, Msg string }

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// Validate checks a config without opening anything.
func (c *Config) Validate() *FieldError {
	if c == nil {
		return nil
	}
	if c.File == "" {
		return &FieldError{"file", "must be set to an absolute path"}
	}
	if !filepath.IsAbs(c.File) {
		return &FieldError{"file", fmt.Sprintf("%q is not an absolute path", c.File)}
	}
	if _, err := ParseLevel(c.Level); err != nil {
		return &FieldError{"level", err.Error()}
	}
	return nil
}

// Discard is the logger used while logging is off.
var Discard = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelError + 100}))

// Open returns a logger for cfg, or for the environment when cfg is nil, and a
// function that closes the file. With neither, it returns Discard. A log file
// that cannot be opened never fails the plugin: logging is best effort and
// the returned error is only for the caller to mention.
func Open(cfg *Config, getenv func(string) string) (*slog.Logger, func(), error) {
	file, level := "", ""
	if cfg != nil && cfg.File != "" {
		file, level = cfg.File, cfg.Level
	} else if f := getenv(EnvFile); f != "" {
		file, level = f, getenv(EnvLevel)
	}
	if file == "" {
		return Discard, func() {}, nil
	}
	lvl, err := ParseLevel(level)
	if err != nil {
		return Discard, func() {}, err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return Discard, func() {}, err
	}
	f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return Discard, func() {}, err
	}
	l := slog.New(slog.NewJSONHandler(f, &slog.HandlerOptions{Level: lvl}))
	return l, func() { _ = f.Close() }, nil
}

// Buffer is a log kept in memory, which several goroutines (a slog
// handler, a command's standard error) write while another reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String is everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
