package demo

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/netlinksafe"
	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/cniruntime"
	"github.com/meshwire/meshwire/internal/probe"
)

// Demo settings used when the default conflist has portmap and bandwidth.
const (
	demoHostPort   = 8080
	demoPodPort    = 80
	demoSinkPort   = 5001
	demoRate       = "10mbit"
	demoTransferMB = 1.25
)

// plugin returns the conflist's first plugin of that type, or nil.
func plugin(list *libcni.NetworkConfigList, typ string) *libcni.PluginConfig {
	for _, p := range list.Plugins {
		if p.Network.Type == typ {
			return p
		}
	}
	return nil
}

// hasPlugin reports whether a conflist has a plugin of that type.
func hasPlugin(list *libcni.NetworkConfigList, typ string) bool { return plugin(list, typ) != nil }

// bridgeName returns the bridge a conflist's bridge plugin uses (the
// plugin's default is cni0), or "" when it has none.
func bridgeName(list *libcni.NetworkConfigList) string {
	p := plugin(list, "bridge")
	if p == nil {
		return ""
	}
	var c struct {
		Bridge string `json:"bridge"`
	}
	_ = json.Unmarshal(p.Bytes, &c)
	if c.Bridge == "" {
		return "cni0"
	}
	return c.Bridge
}

// removeBridgeIfIdle deletes the demo's bridge when the demo created it and
// no port is left on it. The bridge plugin, like the reference, keeps
// bridges on DEL: other pods may come.
func removeBridgeIfIdle(name string) (bool, error) {
	br, err := netlink.LinkByName(name)
	if err != nil {
		return false, nil
	}
	links, err := netlinksafe.LinkList()
	if err != nil {
		return false, err
	}
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			return false, nil
		}
	}
	return true, netlink.LinkDel(br)
}

// demoCaps is what the demo asks of the runtime for the second pod: a host
// port and a rate limit, when the conflist can serve them.
func demoCaps(list *libcni.NetworkConfigList, pod int) map[string]any {
	if pod != 1 {
		return nil
	}
	var ports []string
	bw := ""
	if hasPlugin(list, "portmap") {
		ports = append(ports, fmt.Sprintf("%d:%d/tcp", demoHostPort, demoPodPort))
	}
	if hasPlugin(list, "bandwidth") {
		bw = demoRate
	}
	caps, _ := cniruntime.CapabilityArgs(ports, bw)
	return caps
}

func describeCaps(caps map[string]any) string {
	if len(caps) == 0 {
		return ""
	}
	b, _ := json.Marshal(caps)
	return " with runtimeConfig " + string(b)
}

// serve accepts connections inside the namespace and hands each to handle
// on its own goroutine until the listener is closed.
func serve(nsPath, addr string, handle func(net.Conn)) (io.Closer, error) {
	l, err := probe.Listen(nsPath, "tcp", addr)
	if err != nil {
		return nil, err
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return l, nil
}

// serveHello answers every connection with one line naming the pod.
func serveHello(nsPath, addr, name string) (io.Closer, error) {
	return serve(nsPath, addr, func(c net.Conn) {
		fmt.Fprintf(c, "hello from %s (you are %s)\n", name, c.RemoteAddr())
	})
}

// serveSink reads and discards everything, then reports the byte count.
func serveSink(nsPath, addr string) (io.Closer, error) {
	return serve(nsPath, addr, func(c net.Conn) {
		n, _ := io.Copy(io.Discard, c)
		fmt.Fprintf(c, "%d\n", n)
	})
}

// fetchHello dials addr from nsPath ("" = the host) and returns the line.
func fetchHello(nsPath, addr string) (string, error) {
	c, err := probe.Dial(nsPath, "tcp", addr, 3*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

// measureRate sends n bytes from nsPath to addr and returns the achieved
// rate in Mbit/s, counted from the first byte to the receiver's ack.
func measureRate(nsPath, addr string, n int) (float64, error) {
	c, err := probe.Dial(nsPath, "tcp", addr, 3*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	buf := make([]byte, 32*1024)
	start := time.Now()
	for sent := 0; sent < n; {
		k := min(len(buf), n-sent)
		if _, err := c.Write(buf[:k]); err != nil {
			return 0, err
		}
		sent += k
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("no ack from the receiver: %w", err)
	}
	got, _ := strconv.Atoi(strings.TrimSpace(line))
	if got != n {
		return 0, fmt.Errorf("receiver got %d of %d bytes", got, n)
	}
	return float64(n*8) / time.Since(start).Seconds() / 1e6, nil
}

// gateway returns the gateway of the pod's first IPv4 address.
func gateway(rt *cniruntime.Runtime, rec *cniruntime.Record) net.IP {
	for _, ip := range podIPs(rt, rec) {
		if ip.Address.IP.To4() != nil && ip.Gateway != nil {
			return ip.Gateway
		}
	}
	return nil
}

// portmapSteps shows the host port of pod b reaching its server, from the
// host (127.0.0.1) and from pod a (through its gateway, the host).
func (d *demo) portmapSteps(a, b *cniruntime.Record) {
	srv, err := serveHello(b.NetNS, fmt.Sprintf(":%d", demoPodPort), b.Name)
	if err != nil {
		d.step("start a server in "+b.Name, func() (string, error) { return "", err })
		return
	}
	defer srv.Close()
	hostAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(demoHostPort))
	d.step(fmt.Sprintf("host port %s reaches %s:%d", hostAddr, b.Name, demoPodPort), func() (string, error) {
		return fetchHello("", hostAddr)
	})
	if gw := gateway(d.rt, a); gw != nil {
		addr := net.JoinHostPort(gw.String(), strconv.Itoa(demoHostPort))
		d.step(fmt.Sprintf("%s reaches host port %s of %s", a.Name, addr, b.Name), func() (string, error) {
			return fetchHello(a.NetNS, addr)
		})
	}
}

// bandwidthSteps sends a burst from pod a to pod b, whose ingress is shaped.
func (d *demo) bandwidthSteps(a, b *cniruntime.Record) {
	dst := podAddress(d.rt, b, true)
	if dst == nil {
		return
	}
	sink, err := serveSink(b.NetNS, fmt.Sprintf(":%d", demoSinkPort))
	if err != nil {
		d.step("start a sink in "+b.Name, func() (string, error) { return "", err })
		return
	}
	defer sink.Close()
	d.step(fmt.Sprintf("%s -> %s is shaped to %s", a.Name, b.Name, demoRate), func() (string, error) {
		rate, err := measureRate(a.NetNS, net.JoinHostPort(dst.String(), strconv.Itoa(demoSinkPort)), int(demoTransferMB*1e6))
		if err != nil {
			return "", err
		}
		want, _ := cniruntime.ParseRate(demoRate)
		if rate > float64(want)/1e6*1.5 {
			return "", fmt.Errorf("achieved %.1f Mbit/s: not shaped", rate)
		}
		return fmt.Sprintf("%.2f MB in at %.1f Mbit/s", demoTransferMB, rate), nil
	})
}

// podIPs returns the addresses of the pod's non-loopback attachments, from
// their cached results.
func podIPs(rt *cniruntime.Runtime, rec *cniruntime.Record) []*current.IPConfig {
	var out []*current.IPConfig
	for _, a := range rec.Attachments {
		if a.IfName == "lo" {
			continue
		}
		if res, err := rt.Result(rec, a); err == nil && res != nil {
			out = append(out, res.IPs...)
		}
	}
	return out
}

// podAddress returns the pod's first address of the given family.
func podAddress(rt *cniruntime.Runtime, rec *cniruntime.Record, v4 bool) net.IP {
	for _, ip := range podIPs(rt, rec) {
		if (ip.Address.IP.To4() != nil) == v4 {
			return ip.Address.IP
		}
	}
	return nil
}
