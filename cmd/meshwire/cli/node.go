package cli

import (
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/internal/nodeagent"
)

const nodeUsage = `usage: meshwire node --cni-bin-dir DIR --cni-conf-dir DIR [--chain | [--conflist FILE] [--pod-cidr CIDR]... [--cni-version V] [--intercept]] [--proxy-metadata KEY=VALUE]... [--cleanup-on-exit]
                     [--source-dir DIR] [--plugin-log FILE] [--listen ADDR] [--interval DURATION]
                     [--fastpath [--proxy-uid UID] [--proxy-gid GID] [--outbound-port PORT] [--into-proxy] [--pin-dir DIR] [--cgroup DIR]]`

// node runs `meshwire node`, the node agent (see package nodeagent).
func (e *env) node(args []string) error {
	fs := e.flags("node")
	var o nodeagent.Options
	finish := installerFlags(fs, &o.Install)
	withFastpath := fs.Bool("fastpath", false, "attach the eBPF fast path, keep it attached, detach it on SIGTERM")
	cfg := fastpath.Defaults()
	checkFastpath := fastpathFlags(fs, &cfg)
	fs.StringVar(&o.Listen, "listen", "127.0.0.1:9966", "address of /healthz, /readyz and /metrics")
	fs.DurationVar(&o.Interval, "interval", 10*time.Second, "how often to check that the fast path is attached and read the plugin log")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	if err := finish(e, "node"); err != nil {
		if errors.Is(err, errUsage) {
			return usagef("%v\n%s", err, nodeUsage)
		}
		return err
	}
	if err := checkFastpath("node"); err != nil {
		return err
	}
	if *withFastpath {
		if os.Geteuid() != 0 {
			return errors.New("node --fastpath: must run as root (it loads BPF programs and attaches them to the cgroup v2 root)")
		}
		o.Fastpath = &cfg
	}
	logger := log.New(e.errOut, "meshwire node: ", log.LstdFlags|log.Lmsgprefix)
	o.Logf = logger.Printf
	a, err := nodeagent.New(o)
	if err != nil {
		return fmt.Errorf("node: %w", err)
	}
	ctx, cancel := signalContext()
	defer cancel()
	if err := a.Run(ctx); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	return nil
}
