package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/internal/installer"
	"github.com/meshwire/meshwire/internal/nodeagent"
	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/podstate"
)

// keyValues is a repeatable KEY=VALUE flag.
type keyValues map[string]string

func (kv keyValues) String() string { return fmt.Sprint(map[string]string(kv)) }

func (kv keyValues) Type() string { return "stringToString" }

func (kv keyValues) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", s)
	}
	kv[k] = v
	return nil
}

// installerFlags binds the installer's flags, which `install` and `node`
// share; finish completes the options once the flags are parsed.
func installerFlags(fs *pflag.FlagSet, o *installer.Options) (finish func(e *env, cmd string) error) {
	fs.StringVar(&o.BinDir, "cni-bin-dir", "", "the host's CNI plugin directory (mounted)")
	fs.StringVar(&o.ConfDir, "cni-conf-dir", "", "the host's CNI config directory (mounted)")
	fs.StringVar(&o.SourceDir, "source-dir", "", "where the plugins to install are (default: the meshwire binary's directory)")
	fs.BoolVar(&o.Chain, "chain", false, "chain intercept into the node's primary config instead of writing meshwire's own")
	fs.BoolVar(&o.CleanupOnExit, "cleanup-on-exit", false, "on SIGTERM/SIGINT, remove the config change (the binaries stay)")
	fs.StringVar(&o.PluginLog, "plugin-log", "", "JSON log file the plugins meshwire configures write (an absolute path, the same on the host)")
	fs.Var((*cidrList)(&o.PodCIDRs), "pod-cidr", "without --chain: a subnet of the pods in meshwire's own conflist, instead of the default ones; repeatable (one per address family)")
	conflist := fs.String("conflist", "", "without --chain: the conflist to write instead of the built-in one (read once, at start); --pod-cidr, --cni-version and --intercept apply to it")
	fs.StringVar(&o.CNIVersion, "cni-version", "", "without --chain: the cniVersion of meshwire's own conflist; containerd 1.6 needs 1.0.0 (default: the conflist's own, 1.1.0 for the built-in one)")
	fs.BoolVar(&o.Intercept, "intercept", false, "without --chain: end meshwire's own conflist with the intercept entry --chain adds")
	meta := keyValues{}
	fs.Var(meta, "proxy-metadata", "with --chain or --intercept: an environment variable of every Istio sidecar (meshConfig's defaultConfig.proxyMetadata), e.g. ISTIO_META_DNS_CAPTURE=true; repeatable")
	return func(e *env, cmd string) error {
		if len(meta) > 0 && !o.Chain && !o.Intercept {
			return usagef("%s: --proxy-metadata sets the chained intercept plugin's defaults; it needs --chain or --intercept", cmd)
		}
		if o.Chain && (len(o.PodCIDRs) > 0 || o.Intercept || o.CNIVersion != "" || *conflist != "") {
			return usagef("%s: --conflist, --pod-cidr, --cni-version and --intercept shape meshwire's own conflist; with --chain there is none", cmd)
		}
		if o.CNIVersion != "" {
			if err := installer.CheckCNIVersion(o.CNIVersion); err != nil {
				return usagef("%s: --cni-version: %v", cmd, err)
			}
		}
		o.ProxyMetadata = meta
		if o.BinDir == "" || o.ConfDir == "" {
			return usagef("%s: --cni-bin-dir and --cni-conf-dir are required", cmd)
		}
		if o.PluginLog != "" && !filepath.IsAbs(o.PluginLog) {
			return usagef("%s: --plugin-log %q is not an absolute path", cmd, o.PluginLog)
		}
		if o.SourceDir == "" {
			exe, err := os.Executable()
			if err != nil {
				return fmt.Errorf("%s: find the plugins: %w (give --source-dir)", cmd, err)
			}
			if r, err := filepath.EvalSymlinks(exe); err == nil {
				exe = r
			}
			o.SourceDir = filepath.Dir(exe)
		}
		o.DefaultConflist = e.defaultConflist
		if *conflist != "" {
			b, err := os.ReadFile(*conflist)
			if err != nil {
				return fmt.Errorf("%s: --conflist: %w", cmd, err)
			}
			o.DefaultConflist = b
		}
		return nil
	}
}

// cidrList is the repeatable --pod-cidr flag.
type cidrList []string

func (c *cidrList) String() string { return strings.Join(*c, ",") }

func (c *cidrList) Type() string { return "cidr" }

func (c *cidrList) Set(s string) error {
	canon, err := installer.ParsePodCIDR(s)
	if err != nil {
		return err
	}
	*c = append(*c, canon)
	return nil
}

// installCmd is `meshwire install`, the node installer (see package
// installer).
func (e *env) installCmd() *cobra.Command {
	var o installer.Options
	c := leafCmd("install --cni-bin-dir DIR --cni-conf-dir DIR",
		"install meshwire on a node: the plugins, and meshwire's conflist or intercept chained",
		"The node installer (a DaemonSet's container): copy the plugins into the CNI bin dir, write\n"+
			"meshwire's conflist (or --conflist; subnets from --pod-cidr, intercept at its end with\n"+
			"--intercept) or, with --chain, chain intercept into the node's primary config; keep it\n"+
			"applied until SIGTERM (--once: apply and exit).")
	fs := c.Flags()
	finish := installerFlags(fs, &o)
	fs.BoolVar(&o.Once, "once", false, "apply once and exit instead of watching")
	withFastpath := fs.Bool("fastpath", false, "also attach the eBPF fast path (and detach it on exit with --cleanup-on-exit)")
	startLog := logFlags(fs)
	c.RunE = func(*cobra.Command, []string) error {
		if err := startLog(e, "install"); err != nil {
			return err
		}
		if err := finish(e, "install"); err != nil {
			return err
		}
		return e.install(o, *withFastpath)
	}
	return c
}

// install runs the installer once its flags are parsed.
func (e *env) install(o installer.Options, withFastpath bool) error {
	if o.Once && o.CleanupOnExit {
		return usagef("install: --cleanup-on-exit takes back the change when the installer stops; with --once there is nothing to wait for")
	}
	in, err := installer.New(o)
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	ctx, cancel := signalContext()
	defer cancel()
	var owner *nodeagent.FastpathOwner
	if withFastpath {
		if os.Geteuid() != 0 {
			return errors.New("install --fastpath: must run as root (it loads BPF programs and attaches them to the cgroup v2 root)")
		}
		// One attached before (by `meshwire fastpath attach`, another
		// container) is not this installer's to detach.
		owner = &nodeagent.FastpathOwner{Config: fastpath.Defaults(), Store: podstate.New(nodelayout.Default())}
		if err := owner.Ensure(); err != nil {
			return fmt.Errorf("install --fastpath: %w (nothing was changed)", err)
		}
	}
	err = in.Run(ctx)
	if err != nil {
		err = fmt.Errorf("install: %w", err)
	}
	if owner != nil && o.CleanupOnExit {
		err = errors.Join(err, owner.Release())
	}
	return err
}
