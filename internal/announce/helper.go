package announce

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// envHelper marks a process started by Start: it announces and exits.
const envHelper = "MESHWIRE_ANNOUNCE"

// Start announces ips on ifName inside the namespace nsFD from a detached
// child process of the running binary, and returns without waiting for it.
//
// Closing the packet socket that carries a gratuitous ARP waits for an RCU
// grace period in the kernel (10 ms and more on a busy node); done in the
// plugin itself, that wait would be on every ADD's critical path. The child
// inherits the namespace as a file descriptor (a deleted namespace path does
// not matter) and nothing else: not the runtime's stdout pipe, so the runtime
// does not wait for it either.
func Start(nsFD int, ifName string, ips []net.IP) error {
	if len(ips) == 0 {
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("announce: %w", err)
	}
	dup, err := unix.Dup(nsFD)
	if err != nil {
		return fmt.Errorf("announce: %w", err)
	}
	nsFile := os.NewFile(uintptr(dup), "netns")
	defer nsFile.Close()
	strs := make([]string, len(ips))
	for i, ip := range ips {
		strs[i] = ip.String()
	}
	cmd := exec.Command(exe)
	cmd.Env = []string{envHelper + "=" + ifName + ";" + strings.Join(strs, ",")}
	cmd.ExtraFiles = []*os.File{nsFile} // fd 3 in the child
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("announce: start helper: %w", err)
	}
	return cmd.Process.Release()
}

// ParseHelperEnv reads the helper's job from its environment value.
func ParseHelperEnv(v string) (ifName string, ips []net.IP, err error) {
	ifName, list, ok := strings.Cut(v, ";")
	if !ok || ifName == "" {
		return "", nil, fmt.Errorf("malformed %s=%q", envHelper, v)
	}
	for _, s := range strings.Split(list, ",") {
		ip := net.ParseIP(s)
		if ip == nil {
			return "", nil, fmt.Errorf("malformed address %q in %s", s, envHelper)
		}
		ips = append(ips, ip)
	}
	return ifName, ips, nil
}

// Helper does the announcing when this process was started by Start, then
// exits; otherwise it returns at once. Plugins call it first thing in main.
func Helper() {
	v, ok := os.LookupEnv(envHelper)
	if !ok {
		return
	}
	ifName, ips, err := ParseHelperEnv(v)
	if err != nil {
		os.Exit(2)
	}
	runtime.LockOSThread()
	if err := unix.Setns(3, unix.CLONE_NEWNET); err != nil {
		os.Exit(1)
	}
	if err := Addresses(ifName, ips); err != nil {
		os.Exit(1)
	}
	os.Exit(0)
}
