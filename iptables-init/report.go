package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/intercept/apply"
	"github.com/meshwire/meshwire/internal/intercept/flags"
)

// reporter writes the command's messages as istio's --log_* flags ask:
// those at or above a level, plain ("iptables-init: ...") or as JSON lines
// in Istio's shape ({"level":..,"time":..,"msg":..}), to each target.
// What --dry-run prints is not a message: it always goes to stdout.
type reporter struct {
	level flags.Level
	json  bool
	out   []io.Writer
	now   func() time.Time
}

// newReporter opens the targets of l (stderr when there are none); close
// closes the files it opened.
func newReporter(l flags.Log, stdout, stderr io.Writer) (r *reporter, closeAll func(), err error) {
	r = &reporter{level: l.Level, json: l.JSON, now: time.Now}
	var files []*os.File
	closeAll = func() {
		for _, f := range files {
			f.Close()
		}
	}
	for _, t := range l.Targets {
		switch t {
		case "stdout":
			r.out = append(r.out, stdout)
		case "stderr":
			r.out = append(r.out, stderr)
		default:
			f, err := os.OpenFile(t, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
			if err != nil {
				closeAll()
				return nil, nil, err
			}
			files = append(files, f)
			r.out = append(r.out, f)
		}
	}
	if len(r.out) == 0 {
		r.out = []io.Writer{stderr}
	}
	return r, closeAll, nil
}

type jsonLine struct {
	Level string `json:"level"`
	Time  string `json:"time"`
	Msg   string `json:"msg"`
}

// log writes one message of the given level, if the level is shown.
func (r *reporter) log(level flags.Level, format string, a ...any) {
	if level < r.level {
		return
	}
	msg := fmt.Sprintf(format, a...)
	line := "iptables-init: " + msg + "\n"
	if level == flags.LevelWarn {
		line = "iptables-init: warning: " + msg + "\n"
	}
	if r.json {
		b, _ := json.Marshal(jsonLine{Level: level.String(), Time: r.now().UTC().Format("2006-01-02T15:04:05.000000Z"), Msg: msg})
		line = string(b) + "\n"
	}
	for _, w := range r.out {
		io.WriteString(w, line)
	}
}

func (r *reporter) info(format string, a ...any)   { r.log(flags.LevelInfo, format, a...) }
func (r *reporter) warn(format string, a ...any)   { r.log(flags.LevelWarn, format, a...) }
func (r *reporter) errorf(format string, a ...any) { r.log(flags.LevelError, format, a...) }

// reportInstall reports what apply.Install did (with --dry-run, prints
// what it would do on stdout) and returns the exit status.
func reportInstall(out apply.Outcome, err error, stdout io.Writer, rep *reporter) int {
	if out.FellBack != nil {
		rep.warn("%v; installing %s rules instead (--ebpf-fallback)", out.FellBack, out.Mode)
	}
	fmt.Fprint(stdout, out.DryRun)
	switch {
	case errors.Is(err, apply.ErrDifferent) && out.Mode != intercept.ModeEBPF:
		rep.errorf("%v. Nothing was changed.", err)
		return ExitFailed
	case err != nil:
		rep.errorf("%v", err)
		return ExitFailed
	case out.DryRun != "":
	case out.Mode == intercept.ModeEBPF:
		rep.info("EBPF interception installed (no netfilter rule in the namespace)")
	case out.UpToDate:
		rep.info("rules already installed (%s), nothing to do", out.Backend)
	default:
		fams := "IPv4"
		if out.Request.IPv6 {
			fams = "IPv4 and IPv6"
		}
		rep.info("%s interception installed for %s with %s", out.Mode, fams, out.Backend)
	}
	return ExitOK
}
