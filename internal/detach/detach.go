// Package detach runs a short job of a plugin in a detached child process
// of the same binary, so that the plugin can return to the runtime before
// the job's slow tail is over. The kernel work that follows a gratuitous ARP
// (closing a packet socket) or a link deletion (releasing the device) waits
// for RCU grace periods, 10 to 30 ms on a busy node, that nobody needs to
// wait for.
//
// The child inherits nothing but the files passed (from fd 3 on): not the
// runtime's stdout pipe, so the runtime does not wait for it either, and it
// runs in its own session.
//
// A child can also carry tails: files whose last close blocks in the kernel
// (a netfilter netlink socket after a removal waits for an RCU grace period
// when closed). The child keeps them open after its job until the plugin
// has exited, so that the last close, and its wait, is the child's. It
// learns of the exit without polling: it gets the read end of a pipe whose
// only write end the plugin keeps open until it exits, and reads until EOF.
package detach

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// envJob names the job of a detached child: "<job>:<arg>"; envHold, when
// it carries tails, is the descriptor of the pipe that ends when the plugin
// exits.
const (
	envJob  = "MESHWIRE_DETACHED_JOB"
	envHold = "MESHWIRE_DETACHED_HOLD"
)

// holdJob is the built-in job of a child that only carries tails.
const holdJob = "hold"

// StartHolding runs job with arg in a detached child and returns once it
// started. files are passed from descriptor 3 on; tails, when given, come
// after them, and the child closes them only once its job is done and this
// process has exited. The caller closes its own copies after the call.
func StartHolding(job, arg string, files, tails []*os.File) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("detach %s: %w", job, err)
	}
	cmd := exec.Command(exe)
	cmd.Env = []string{envJob + "=" + job + ":" + arg}
	cmd.ExtraFiles = append(append([]*os.File{}, files...), tails...)
	var lifeline *os.File
	if len(tails) > 0 {
		r, w, err := os.Pipe()
		if err != nil {
			return fmt.Errorf("detach %s: %w", job, err)
		}
		defer r.Close()
		lifeline = w
		// ExtraFiles[i] is the child's descriptor 3+i.
		cmd.Env = append(cmd.Env, envHold+"="+strconv.Itoa(3+len(cmd.ExtraFiles)))
		cmd.ExtraFiles = append(cmd.ExtraFiles, r)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		if lifeline != nil {
			lifeline.Close()
		}
		return fmt.Errorf("detach %s: %w", job, err)
	}
	if lifeline != nil {
		// Kept open (and reachable, so that no finalizer closes it) until
		// this process exits; close-on-exec keeps it from other children.
		lifelines.Lock()
		lifelines.files = append(lifelines.files, lifeline)
		lifelines.Unlock()
	}
	return cmd.Process.Release()
}

// lifelines are the write ends of the pipes of holding children.
var lifelines struct {
	sync.Mutex
	files []*os.File
}

// Hold hands tails to a detached child that does nothing else.
func Hold(tails ...*os.File) error { return StartHolding(holdJob, "", nil, tails) }

// Job is the work of a detached child; it gets the arg given to StartHolding.
type Job func(arg string) error

// Run does the job when this process was started by StartHolding or Hold,
// and exits; otherwise it returns at once. Plugins call it first thing in
// main.
func Run(jobs map[string]Job) {
	v, ok := os.LookupEnv(envJob)
	if !ok {
		return
	}
	code := 0
	if err := dispatch(jobs, v); err != nil {
		code = 1
	}
	if fd, err := strconv.Atoi(os.Getenv(envHold)); err == nil && fd > 2 {
		// Non-blocking before NewFile, so that reads go through the
		// poller and honour a deadline.
		_ = syscall.SetNonblock(fd, true)
		waitEOF(os.NewFile(uintptr(fd), "lifeline"), holdLimit)
	}
	os.Exit(code)
}

// holdLimit bounds how long a child waits for the plugin to exit.
const holdLimit = 10 * time.Second

// waitEOF returns once everything written to f was read and its write ends
// are closed, or after limit.
func waitEOF(f *os.File, limit time.Duration) {
	_ = f.SetReadDeadline(time.Now().Add(limit))
	_, _ = io.Copy(io.Discard, f)
}

func dispatch(jobs map[string]Job, v string) error {
	if v == holdJob+":" {
		return nil
	}
	if name, arg, ok := strings.Cut(v, ":"); ok {
		if job, ok := jobs[name]; ok {
			return job(arg)
		}
	}
	return fmt.Errorf("unknown detached job %q", v)
}
