package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/intercept/apply"
	"github.com/meshwire/meshwire/internal/intercept/flags"
)

var noEnv = flags.Env{}

// TestRunBadFlagsExit2 checks the exit status and that a bad command line
// stops before anything is touched (Run returns before entering a
// namespace or reading the firewall).
func TestRunBadFlagsExit2(t *testing.T) {
	var out, errb bytes.Buffer
	if code := Run([]string{"-p", "nope", "--network-namespace", "/nonexistent"}, noEnv, &out, &errb); code != ExitUsage {
		t.Fatalf("exit %d, want %d", code, ExitUsage)
	}
	if out.Len() != 0 || !strings.Contains(errb.String(), "--envoy-port") || !strings.Contains(errb.String(), "Nothing was changed") {
		t.Fatalf("stdout %q stderr %q", out.String(), errb.String())
	}
	out.Reset()
	if code := Run([]string{"-h"}, noEnv, &out, &errb); code != ExitOK || !strings.Contains(out.String(), "--istio-inbound-interception-mode") {
		t.Fatalf("help: exit %d, %q", code, out.String())
	}
	// A log file that cannot be opened is a bad command line too.
	errb.Reset()
	if code := Run([]string{"--log_target", "/nonexistent/dir/log", "--network-namespace", "/nonexistent"}, noEnv, &out, &errb); code != ExitUsage || !strings.Contains(errb.String(), "--log_target") {
		t.Fatalf("bad log target: exit %d, %q", code, errb.String())
	}
}

// TestReporter checks the --log_* flags: level filter, plain and JSON
// lines in Istio's shape, every target.
func TestReporter(t *testing.T) {
	file := filepath.Join(t.TempDir(), "init.log")
	var out, errb bytes.Buffer
	cases := []struct {
		log        flags.Log
		want       string // in each target
		stdout     bool
		stderr     bool
		file       bool
		suppressed bool
	}{
		{log: flags.Log{Level: flags.LevelInfo}, want: "iptables-init: hello 1\n", stderr: true},
		{log: flags.Log{Level: flags.LevelWarn}, suppressed: true},
		{log: flags.Log{Level: flags.LevelDebug, Targets: []string{"stdout", file}}, want: "iptables-init: hello 1\n", stdout: true, file: true},
		{log: flags.Log{Level: flags.LevelInfo, JSON: true, Targets: []string{"stderr"}}, want: `{"level":"info","time":"2026-08-22T10:11:12.000013Z","msg":"hello 1"}` + "\n", stderr: true},
	}
	for i, tc := range cases {
		out.Reset()
		errb.Reset()
		os.Remove(file)
		r, closeAll, err := newReporter(tc.log, &out, &errb)
		if err != nil {
			t.Fatal(err)
		}
		r.now = func() time.Time { return time.Date(2026, 8, 22, 12, 11, 12, 13000, time.FixedZone("CEST", 7200)) }
		r.info("hello %d", 1)
		closeAll()
		got, _ := os.ReadFile(file)
		for _, w := range []struct {
			name string
			on   bool
			text string
		}{{"stdout", tc.stdout, out.String()}, {"stderr", tc.stderr, errb.String()}, {"file", tc.file, string(got)}} {
			want := ""
			if w.on && !tc.suppressed {
				want = tc.want
			}
			if w.text != want {
				t.Errorf("case %d: %s got %q, want %q", i, w.name, w.text, want)
			}
		}
		if tc.log.JSON {
			var line map[string]string
			if err := json.Unmarshal(errb.Bytes(), &line); err != nil || line["level"] != "info" {
				t.Errorf("case %d: not a JSON line: %q", i, errb.String())
			}
		}
	}
	// Warnings and errors pass an info filter; none shows nothing.
	errb.Reset()
	r, _, _ := newReporter(flags.Log{Level: flags.LevelError}, &out, &errb)
	r.warn("w")
	r.errorf("e")
	if errb.String() != "iptables-init: e\n" {
		t.Fatalf("error level: %q", errb.String())
	}
	errb.Reset()
	r, _, _ = newReporter(flags.Log{Level: flags.LevelNone}, &out, &errb)
	r.errorf("e")
	if errb.Len() != 0 {
		t.Fatalf("none: %q", errb.String())
	}
}

// TestReportInstall pins what iptables-init says of each outcome of
// apply.Install: its messages and exit statuses are istio-iptables'
// users' interface.
func TestReportInstall(t *testing.T) {
	ipt := firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantNFT}
	v6 := apply.Request{IPv6: true}
	unavailable := errors.New("the ebpf programs are not attached")
	cases := []struct {
		name     string
		out      apply.Outcome
		err      error
		code     int
		stdout   string
		messages string
	}{
		{"installed", apply.Outcome{Mode: intercept.ModeRedirect, Backend: ipt, Request: v6}, nil, ExitOK, "",
			"iptables-init: REDIRECT interception installed for IPv4 and IPv6 with iptables-nft\n"},
		{"up to date", apply.Outcome{Mode: intercept.ModeTProxy, Backend: ipt, UpToDate: true}, nil, ExitOK, "",
			"iptables-init: rules already installed (iptables-nft), nothing to do\n"},
		{"ebpf", apply.Outcome{Mode: intercept.ModeEBPF}, nil, ExitOK, "",
			"iptables-init: EBPF interception installed (no netfilter rule in the namespace)\n"},
		{"dry run", apply.Outcome{Mode: intercept.ModeRedirect, Backend: ipt, DryRun: "# backend: iptables-nft\n"}, nil, ExitOK, "# backend: iptables-nft\n", ""},
		{"other rules", apply.Outcome{Mode: intercept.ModeRedirect, Backend: ipt}, fmt.Errorf("%w: IPv4 (iptables-nft)", apply.ErrDifferent), ExitFailed, "",
			"iptables-init: interception rules with other settings are already installed: IPv4 (iptables-nft). Nothing was changed.\n"},
		{"other mode's rules, ebpf", apply.Outcome{Mode: intercept.ModeEBPF}, fmt.Errorf("%w: rules", apply.ErrDifferent), ExitFailed, "",
			"iptables-init: interception rules with other settings are already installed: rules\n"},
		{"fallback", apply.Outcome{Mode: intercept.ModeTProxy, FellBack: unavailable, Backend: ipt}, nil, ExitOK, "",
			"iptables-init: warning: the ebpf programs are not attached; installing TPROXY rules instead (--ebpf-fallback)\n" +
				"iptables-init: TPROXY interception installed for IPv4 with iptables-nft\n"},
		{"failed", apply.Outcome{Mode: intercept.ModeRedirect, Backend: ipt}, errors.New("apply IPv4 rules: refused"), ExitFailed, "",
			"iptables-init: apply IPv4 rules: refused\n"},
	}
	for _, tc := range cases {
		var out, errb bytes.Buffer
		rep := &reporter{level: flags.LevelInfo, out: []io.Writer{&errb}, now: time.Now}
		if code := reportInstall(tc.out, tc.err, &out, rep); code != tc.code || out.String() != tc.stdout || errb.String() != tc.messages {
			t.Errorf("%s: exit %d, stdout %q, messages %q", tc.name, code, out.String(), errb.String())
		}
	}
}
