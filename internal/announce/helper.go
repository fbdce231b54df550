package announce

import (
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/detach"
)

// JobName is the detached job that announces (see Job).
const JobName = "announce"

// Start announces ips on ifName inside the namespace nsFD from a detached
// child (internal/detach) and returns without waiting for it: closing the
// packet socket that carried the gratuitous ARP waits for an RCU grace
// period, which ADD need not wait for. The child gets the namespace as a file
// descriptor, so a namespace path deleted meanwhile does not matter. tails
// ride along (detach.StartHolding); without addresses they go to a child
// that only holds them. The caller closes its copies.
func Start(nsFD int, ifName string, ips []net.IP, tails ...*os.File) error {
	if len(ips) == 0 {
		if len(tails) > 0 {
			return detach.Hold(tails...)
		}
		return nil
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
	return detach.StartHolding(JobName, ifName+";"+strings.Join(strs, ","), []*os.File{nsFile}, tails)
}

// parseJobArg reads the job's argument: "ifname;ip,ip".
func parseJobArg(v string) (ifName string, ips []net.IP, err error) {
	ifName, list, ok := strings.Cut(v, ";")
	if !ok || ifName == "" {
		return "", nil, fmt.Errorf("malformed announce job %q", v)
	}
	for _, s := range strings.Split(list, ",") {
		ip := net.ParseIP(s)
		if ip == nil {
			return "", nil, fmt.Errorf("malformed address %q in announce job", s)
		}
		ips = append(ips, ip)
	}
	return ifName, ips, nil
}

// Job is the detached child's work: enter the namespace passed as fd 3 and
// announce.
func Job(arg string) error {
	ifName, ips, err := parseJobArg(arg)
	if err != nil {
		return err
	}
	runtime.LockOSThread()
	if err := unix.Setns(3, unix.CLONE_NEWNET); err != nil {
		return err
	}
	return addresses(ifName, ips)
}
