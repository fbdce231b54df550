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
package detach

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// envJob names the job of a detached child: "<job>:<arg>".
const envJob = "MESHWIRE_DETACHED_JOB"

// Start runs job with arg in a detached child and returns once it started.
func Start(job, arg string, files ...*os.File) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("detach %s: %w", job, err)
	}
	cmd := exec.Command(exe)
	cmd.Env = []string{envJob + "=" + job + ":" + arg}
	cmd.ExtraFiles = files
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("detach %s: %w", job, err)
	}
	return cmd.Process.Release()
}

// Job is the work of a detached child; it gets the arg given to Start.
type Job func(arg string) error

// Run does the job when this process was started by Start, and exits;
// otherwise it returns at once. Plugins call it first thing in main.
func Run(jobs map[string]Job) {
	v, ok := os.LookupEnv(envJob)
	if !ok {
		return
	}
	code := 0
	if err := dispatch(jobs, v); err != nil {
		code = 1
	}
	os.Exit(code)
}

func dispatch(jobs map[string]Job, v string) error {
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
