package netns

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// Cookie is the calling thread's network namespace cookie: the value
// bpf_get_netns_cookie gives BPF programs for sockets of that namespace,
// never reused while the host runs (SO_NETNS_COOKIE, Linux 5.14). Call it
// inside Enter for a pod's namespace.
func Cookie() (uint64, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket for SO_NETNS_COOKIE: %w", err)
	}
	defer unix.Close(fd)
	v, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
	if err != nil {
		return 0, fmt.Errorf("SO_NETNS_COOKIE: %w", err)
	}
	return v, nil
}
