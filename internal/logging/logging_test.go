package logging

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestValidate(t *testing.T) {
	cases := []struct {
		c     *Config
		field string
	}{
		{nil, ""},
		{&Config{File: "/var/log/x.log"}, ""},
		{&Config{File: "/var/log/x.log", Level: "DEBUG"}, ""},
		{&Config{}, "file"},
		{&Config{File: "x.log"}, "file"},
		{&Config{File: "/x.log", Level: "verbose"}, "level"},
	}
	for _, c := range cases {
		err := c.c.Validate()
		if (err == nil) != (c.field == "") || (err != nil && err.Field != c.field) {
			t.Errorf("Validate(%+v) = %v, want field %q", c.c, err, c.field)
		}
	}
}

func TestOpen(t *testing.T) {
	none := func(string) string { return "" }
	l, closeFn, err := Open(nil, none)
	if err != nil || l != Discard {
		t.Fatalf("no config, no env: %v %v", l, err)
	}
	closeFn()

	dir := t.TempDir()
	file := filepath.Join(dir, "a", "cni.log")
	l, closeFn, err = Open(&Config{File: file, Level: "warn"}, none)
	if err != nil {
		t.Fatal(err)
	}
	l.Info("dropped")
	l.Warn("kept", "k", 1)
	closeFn()
	b, _ := os.ReadFile(file)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 1 {
		t.Fatalf("level warn wrote %d lines: %q", len(lines), b)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &rec); err != nil || rec["msg"] != "kept" {
		t.Fatalf("record %q: %v", lines[0], err)
	}

	envFile := filepath.Join(dir, "env.log")
	env := map[string]string{EnvFile: envFile, EnvLevel: "debug"}
	l, closeFn, err = Open(nil, func(k string) string { return env[k] })
	if err != nil {
		t.Fatal(err)
	}
	if !l.Enabled(nil, slog.LevelDebug) {
		t.Fatal("MESHWIRE_LOG_LEVEL=debug not honoured")
	}
	l.Debug("from env")
	closeFn()
	if b, _ := os.ReadFile(envFile); !strings.Contains(string(b), "from env") {
		t.Fatalf("MESHWIRE_LOG file: %q", b)
	}
}
