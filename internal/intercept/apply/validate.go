package apply

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"time"

	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/origdst"
)

// Validate checks from inside the namespace that outbound redirection
// really works: it listens on the outbound capture port, connects to an
// address the rules capture on probePort, and expects that connection to
// arrive on the listener with the probe's address as original destination.
// It must run on a thread in the pod's namespace, as a user the rules
// capture (not the proxy's).
func Validate(ctx context.Context, cfg intercept.Config, fams []intercept.Family, probePort uint16, timeout time.Duration) error {
	for _, f := range fams {
		target, err := intercept.ProbeTarget(cfg, f, probePort)
		if err != nil {
			return err
		}
		if err := validateOne(ctx, cfg, f, netip.AddrPortFrom(target, probePort), timeout); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
	}
	return nil
}

func validateOne(ctx context.Context, cfg intercept.Config, f intercept.Family, target netip.AddrPort, timeout time.Duration) error {
	network, host := "tcp4", "0.0.0.0"
	if f == intercept.V6 {
		network, host = "tcp6", "::"
	}
	ln, err := net.Listen(network, net.JoinHostPort(host, strconv.Itoa(int(cfg.ProxyPort))))
	if err != nil {
		return fmt.Errorf("listen on the outbound capture port %d: %w", cfg.ProxyPort, err)
	}
	defer ln.Close()
	got := make(chan netip.AddrPort, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		if ap, err := origdst.Redirected(c.(*net.TCPConn)); err == nil {
			got <- ap
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, network, target.String())
	if err != nil {
		return fmt.Errorf("connection to %s was not redirected to port %d: %w", target, cfg.ProxyPort, err)
	}
	defer c.Close()
	select {
	case ap := <-got:
		if ap != target {
			return fmt.Errorf("redirected connection reports original destination %s, want %s", ap, target)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("connection to %s was not redirected to port %d: %w", target, cfg.ProxyPort, errors.New("reached something else"))
	}
}
