// Package detach runs a short job of a plugin in a detached child process
// of the same binary, so that the plugin can return to the runtime before
// the job's slow tail is over: the kernel work that follows a gratuitous ARP
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
// has exited, so that the last close, and its wait, is the child's.
package detach

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// envJob names the job of a detached child: "<job>:<arg>"; envHold tells it
// that it carries tails.
const (
	envJob  = "MESHWIRE_DETACHED_JOB"
	envHold = "MESHWIRE_DETACHED_HOLD"
)

// holdJob is the built-in job of a child that only carries tails.
const holdJob = "hold"

// Start runs job with arg in a detached child and returns once it started.
func Start(job, arg string, files ...*os.File) error {
	return StartHolding(job, arg, files, nil)
}

// StartHolding is Start with tails: they are passed after files, and the
// child closes them only once its job is done and this process has exited.
// The caller closes its own copies after the call.
func StartHolding(job, arg string, files, tails []*os.File) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("detach %s: %w", job, err)
	}
	cmd := exec.Command(exe)
	cmd.Env = []string{envJob + "=" + job + ":" + arg}
	if len(tails) > 0 {
		cmd.Env = append(cmd.Env, envHold+"=1")
	}
	cmd.ExtraFiles = append(append([]*os.File{}, files...), tails...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("detach %s: %w", job, err)
	}
	return cmd.Process.Release()
}

// Hold hands tails to a detached child that does nothing else.
func Hold(tails ...*os.File) error { return StartHolding(holdJob, "", nil, tails) }

// Job is the work of a detached child; it gets the arg given to Start.
type Job func(arg string) error

// Run does the job when this process was started by Start, and exits;
// otherwise it returns at once. Plugins call it first thing in main.
func Run(jobs map[string]Job) {
	v, ok := os.LookupEnv(envJob)
	if !ok {
		return
	}
	parent := os.Getppid()
	code := 0
	if err := dispatch(jobs, v); err != nil {
		code = 1
	}
	if os.Getenv(envHold) != "" {
		waitGone(parent, os.Getppid, holdLimit)
	}
	os.Exit(code)
}

// holdLimit bounds how long a child waits for the plugin to exit.
const holdLimit = 10 * time.Second

// waitGone returns once the process parent is no longer this one's parent
// (it exited and this one was re-parented), or after limit.
func waitGone(parent int, getppid func() int, limit time.Duration) {
	for end := time.Now().Add(limit); getppid() == parent && time.Now().Before(end); {
		time.Sleep(2 * time.Millisecond)
	}
}

func dispatch(jobs map[string]Job, v string) error {
	if v == holdJob+":" {
		return nil
	}
	for i := 0; i < len(v); i++ {
		if v[i] == ':' {
			if job, ok := jobs[v[:i]]; ok {
				return job(v[i+1:])
			}
			break
		}
	}
	return fmt.Errorf("unknown detached job %q", v)
}
