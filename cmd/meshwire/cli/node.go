package cli

import (
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/internal/nodeagent"
)

// nodeCmd is `meshwire node`, the node agent (see package nodeagent).
func (e *env) nodeCmd() *cobra.Command {
	var o nodeagent.Options
	c := leafCmd("node --cni-bin-dir DIR --cni-conf-dir DIR",
		"run the node agent: the installer's work, the fast path kept attached, probes, metrics",
		"The node agent (a DaemonSet's one container): the installer's work, the fast path attached\n"+
			"and kept attached (--fastpath), every meshed pod's interception checked and repaired,\n"+
			"/healthz, /readyz and /metrics on --listen; on SIGTERM it detaches and cleans up.")
	fs := c.Flags()
	finish := installerFlags(fs, &o.Install)
	withFastpath := fs.Bool("fastpath", false, "attach the eBPF fast path, keep it attached, detach it on SIGTERM")
	cfg := fastpath.Defaults()
	checkFastpath := fastpathFlags(fs, &cfg)
	fs.StringVar(&o.Listen, "listen", "127.0.0.1:9966", "address of /healthz, /readyz and /metrics")
	fs.DurationVar(&o.Interval, "interval", 10*time.Second, "how often to check that the fast path is attached and every meshed pod's interception is in place, and read the plugin log")
	c.RunE = func(*cobra.Command, []string) error {
		if err := finish(e, "node"); err != nil {
			return err
		}
		if err := checkFastpath("node"); err != nil {
			return err
		}
		if *withFastpath {
			o.Fastpath = &cfg
		}
		return e.node(o)
	}
	return c
}

// node runs the agent once its flags are parsed.
func (e *env) node(o nodeagent.Options) error {
	if o.Fastpath != nil && os.Geteuid() != 0 {
		return errors.New("node --fastpath: must run as root (it loads BPF programs and attaches them to the cgroup v2 root)")
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
