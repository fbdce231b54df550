// Package announce tells a pod's neighbours about its addresses right after
// they are configured: a gratuitous ARP for IPv4 (j-keck/arping) and an
// unsolicited neighbor advertisement for IPv6, so that caches holding the
// previous owner of a recycled address are corrected at once. Start hands
// the work to a detached child (internal/detach) that enters the pod's
// network namespace and runs Job; the plugin registers Job under JobName.
package announce

import (
	"errors"
	"fmt"
	"net"

	"github.com/j-keck/arping"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv6"
)

// addresses announces every address of ips on the interface ifName.
func addresses(ifName string, ips []net.IP) error {
	iface, err := net.InterfaceByName(ifName)
	if err != nil {
		return fmt.Errorf("announce on %s: %w", ifName, err)
	}
	var errs []error
	for _, ip := range ips {
		if ip.To4() != nil {
			if err := arping.GratuitousArpOverIface(ip.To4(), *iface); err != nil {
				errs = append(errs, fmt.Errorf("gratuitous ARP for %s on %s: %w", ip, ifName, err))
			}
			continue
		}
		if err := neighborAdvertisement(iface, ip); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// allNodes is ff02::1, where unsolicited advertisements go (RFC 4861 7.2.6).
var allNodes = net.ParseIP("ff02::1")

// naMessage builds an unsolicited neighbor advertisement for target with the
// Override flag and the target link-layer address option.
func naMessage(target net.IP, mac net.HardwareAddr) ([]byte, error) {
	body := make([]byte, 4+16, 4+16+8)
	body[0] = 0x20 // Override; not Solicited, not Router
	copy(body[4:], target.To16())
	if len(mac) > 0 {
		opt := []byte{2, byte((2 + len(mac) + 7) / 8)} // type 2: target link-layer address, length in 8-byte units
		opt = append(opt, mac...)
		for len(opt)%8 != 0 {
			opt = append(opt, 0)
		}
		body = append(body, opt...)
	}
	m := icmp.Message{Type: ipv6.ICMPTypeNeighborAdvertisement, Body: &icmp.RawBody{Data: body}}
	return m.Marshal(nil) // the kernel fills in the checksum of ICMPv6 sockets
}

// neighborAdvertisement sends one unsolicited NA for target from iface.
func neighborAdvertisement(iface *net.Interface, target net.IP) error {
	msg, err := naMessage(target, iface.HardwareAddr)
	if err != nil {
		return err
	}
	c, err := icmp.ListenPacket("ip6:ipv6-icmp", target.String()+"%"+iface.Name)
	if err != nil {
		return fmt.Errorf("neighbor advertisement for %s on %s: %w", target, iface.Name, err)
	}
	defer c.Close()
	p := c.IPv6PacketConn()
	if err := p.SetMulticastHopLimit(255); err != nil {
		return fmt.Errorf("neighbor advertisement for %s: hop limit: %w", target, err)
	}
	if err := p.SetMulticastInterface(iface); err != nil {
		return fmt.Errorf("neighbor advertisement for %s: interface: %w", target, err)
	}
	if _, err := c.WriteTo(msg, &net.IPAddr{IP: allNodes, Zone: iface.Name}); err != nil {
		return fmt.Errorf("neighbor advertisement for %s on %s: %w", target, iface.Name, err)
	}
	return nil
}
