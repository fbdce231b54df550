// Package origdst reads the destination a client originally asked for on a
// connection that netfilter redirected to a local proxy: SO_ORIGINAL_DST
// (IPv4) or IP6T_SO_ORIGINAL_DST (IPv6) for REDIRECT, the socket's own local
// address for TPROXY.
package origdst

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Redirected returns the original destination of a connection that REDIRECT
// (or DNAT) sent to this socket.
func Redirected(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	local := c.LocalAddr().(*net.TCPAddr)
	v6 := local.IP.To4() == nil
	var ap netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		var buf [28]byte // sockaddr_in6 is the larger
		size := uint32(len(buf))
		level := unix.SOL_IP
		if v6 {
			level = unix.SOL_IPV6
		}
		_, _, e := syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, uintptr(level), unix.SO_ORIGINAL_DST,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
		if e != 0 {
			serr = fmt.Errorf("getsockopt SO_ORIGINAL_DST: %w", e)
			return
		}
		port := binary.BigEndian.Uint16(buf[2:4])
		if v6 {
			var a [16]byte
			copy(a[:], buf[8:24])
			ap = netip.AddrPortFrom(netip.AddrFrom16(a), port)
		} else {
			var a [4]byte
			copy(a[:], buf[4:8])
			ap = netip.AddrPortFrom(netip.AddrFrom4(a), port)
		}
	})
	if err != nil {
		return netip.AddrPort{}, err
	}
	return ap, serr
}

// Local returns the connection's local address: for a connection TPROXY
// handed to a transparent listener, the destination the client asked for.
func Local(c net.Conn) netip.AddrPort {
	ap := c.LocalAddr().(*net.TCPAddr).AddrPort()
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
