package cli

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/internal/crigc"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/installer"
	"github.com/meshwire/meshwire/internal/nodeagent"
	"github.com/meshwire/meshwire/internal/nodelayout"
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
	fs.StringVar(&o.StateDir, "node-state-dir", nodelayout.StateDir, "where the pods' records and ambient mode's socket are, as the plugins keep them")
	startLog := logFlags(fs)
	withAmbient, checkAmbient := ambientFlags(fs)
	var gc nodeagent.RuntimeGC
	fs.StringVar(&gc.Options.CRISocket, "gc-cri-socket", "", "run the CNI GC of the node's network (the first config of --cni-conf-dir) every --gc-interval against the pod sandboxes the runtime at this CRI socket lists, as meshwire gc --cri-socket does (for a runtime that does not call GC: containerd 2.4); off when empty")
	fs.DurationVar(&gc.Options.MinAge, "gc-min-age", crigc.DefaultMinAge, "with --gc-cri-socket: keep every attachment made less than this before the listing (gc's --min-age)")
	fs.DurationVar(&gc.Every, "gc-interval", 5*time.Minute, "with --gc-cri-socket: how often")
	fs.StringVar(&gc.Options.CacheDir, "cni-cache-dir", crigc.DefaultCacheDir, "with --gc-cri-socket: the runtime's libcni cache directory (results/ in it)")
	keepWhile := fs.String("keep-while-daemonset", "", "with --cleanup-on-exit: on SIGTERM, keep the config change while this DaemonSet (NAMESPACE/NAME, the agent's own, read with the pod's service account) exists and is not being deleted: an update, whose next agent takes it over")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if err := startLog(e, "node"); err != nil {
			return err
		}
		if err := finish(e, "node"); err != nil {
			return err
		}
		if err := checkFastpath("node"); err != nil {
			return err
		}
		if *withFastpath {
			o.Fastpath = &cfg
		}
		amb, err := checkAmbient(o.Install)
		if err != nil {
			return err
		}
		if *withAmbient {
			o.Ambient = amb
		}
		if gc.Options.CRISocket != "" {
			if gc.Options.MinAge < 0 {
				return usagef("node: --gc-min-age: must not be negative, got %s", gc.Options.MinAge)
			}
			if gc.Every <= 0 {
				return usagef("node: --gc-interval: must be positive, got %s", gc.Every)
			}
			o.RuntimeGC = &gc
		} else {
			for _, f := range []string{"gc-min-age", "gc-interval", "cni-cache-dir"} {
				if c.Flags().Changed(f) {
					return usagef("node: --%s is for the runtime GC: it needs --gc-cri-socket", f)
				}
			}
		}
		if *keepWhile != "" {
			ns, name, ok := strings.Cut(*keepWhile, "/")
			if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
				return usagef("node: --keep-while-daemonset: NAMESPACE/NAME, not %q", *keepWhile)
			}
			if !o.Install.CleanupOnExit {
				return usagef("node: --keep-while-daemonset decides when --cleanup-on-exit takes the config change back; it needs --cleanup-on-exit")
			}
			o.Install.KeepOnExit = nodeagent.KeepWhileDaemonSet(nil, ns, name, 5*time.Second)
		}
		return e.node(o)
	}
	return c
}

// node runs the agent once its flags are parsed.
func (e *env) node(o nodeagent.Options) error {
	if (o.Fastpath != nil || o.Ambient != nil) && os.Geteuid() != 0 {
		return errors.New("node --fastpath, --ambient: must run as root (they load BPF programs, program other namespaces' firewalls)")
	}
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

// ambientFlags adds the flags of ambient mode; check validates them once
// parsed.
func ambientFlags(fs *pflag.FlagSet) (on *bool, check func(installer.Options) (*nodeagent.AmbientOptions, error)) {
	var o nodeagent.AmbientOptions
	on = fs.Bool("ambient", false, "Istio ambient mode: enroll pods as istio-cni's node agent does, hand them to ztunnel (docs/ambient.md)")
	fs.BoolVar(&o.Config.RedirectDNS, "ambient-dns-capture", false, "ambient: send enrolled pods' DNS to ztunnel's DNS proxy (a pod's ambient.istio.io/dns-capture wins)")
	fs.BoolVar(&o.Config.IPv6, "ambient-ipv6", false, "ambient: the IPv6 rules too")
	backend := fs.String("ambient-backend", "", "ambient: firewall of the rules: iptables-nft, iptables-legacy or nftables (default: the host's)")
	fs.StringVar(&o.ZtunnelSocket, "ztunnel-socket", nodelayout.ZtunnelSocket, "ambient: the ZDS socket ztunnel connects to")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", "", "ambient: kubeconfig of the API server (default: the in-cluster config when in a pod)")
	fs.StringVar(&o.NodeName, "node-name", os.Getenv("NODE_NAME"), "ambient: this node's name in the API server (default $NODE_NAME)")
	fs.Uint32Var(&o.Config.KubeletUID, "kubelet-uid", 0, "ambient with nftables: the uid of kubelet, whose probes the host rule matches")
	return on, func(in installer.Options) (*nodeagent.AmbientOptions, error) {
		if !*on {
			return nil, nil
		}
		if !in.Chain && !in.Intercept {
			return nil, usagef("node: --ambient needs the intercept plugin in the node's config (--chain or --intercept): it tells the agent where each pod's namespace is")
		}
		if *backend != "" {
			b, err := firewall.Parse(*backend)
			if err != nil {
				return nil, usagef("node: --ambient-backend: %v", err)
			}
			o.Backend = b
		}
		o.API = o.Kubeconfig != "" || os.Getenv("KUBERNETES_SERVICE_HOST") != ""
		return &o, nil
	}
}
