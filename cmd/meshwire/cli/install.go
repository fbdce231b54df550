package cli

import (
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strings"

	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/internal/installer"
)

const installUsage = `usage: meshwire install --cni-bin-dir DIR --cni-conf-dir DIR [--chain [--proxy-metadata KEY=VALUE]...] [--once] [--cleanup-on-exit] [--source-dir DIR] [--fastpath]`

// keyValues is a repeatable KEY=VALUE flag.
type keyValues map[string]string

func (kv keyValues) String() string { return fmt.Sprint(map[string]string(kv)) }

func (kv keyValues) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", s)
	}
	kv[k] = v
	return nil
}

// install runs `meshwire install`, the node installer (see package install).
func (e *env) install(args []string) error {
	fs := e.flags("install")
	var o installer.Options
	fs.StringVar(&o.BinDir, "cni-bin-dir", "", "the host's CNI plugin directory (mounted)")
	fs.StringVar(&o.ConfDir, "cni-conf-dir", "", "the host's CNI config directory (mounted)")
	fs.StringVar(&o.SourceDir, "source-dir", "", "where the plugins to install are (default: the meshwire binary's directory)")
	fs.BoolVar(&o.Chain, "chain", false, "chain intercept into the node's primary config instead of writing meshwire's own")
	fs.BoolVar(&o.Once, "once", false, "apply once and exit instead of watching")
	fs.BoolVar(&o.CleanupOnExit, "cleanup-on-exit", false, "on SIGTERM/SIGINT, remove the config change (the binaries stay)")
	withFastpath := fs.Bool("fastpath", false, "also attach the eBPF fast path (and detach it on exit with --cleanup-on-exit)")
	meta := keyValues{}
	fs.Var(meta, "proxy-metadata", "with --chain: an environment variable of every Istio sidecar (meshConfig's defaultConfig.proxyMetadata), e.g. ISTIO_META_DNS_CAPTURE=true; repeatable")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	if len(meta) > 0 && !o.Chain {
		return usagef("install: --proxy-metadata sets the chained intercept plugin's defaults; it needs --chain")
	}
	o.ProxyMetadata = meta
	if o.BinDir == "" || o.ConfDir == "" {
		return usagef("install: --cni-bin-dir and --cni-conf-dir are required\n%s", installUsage)
	}
	if o.Once && o.CleanupOnExit {
		return usagef("install: --cleanup-on-exit takes back the change when the installer stops; with --once there is nothing to wait for")
	}
	if o.SourceDir == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("install: find the plugins: %w (give --source-dir)", err)
		}
		if r, err := filepath.EvalSymlinks(exe); err == nil {
			exe = r
		}
		o.SourceDir = filepath.Dir(exe)
	}
	o.DefaultConflist = e.defaultConflist
	logger := log.New(e.errOut, "meshwire install: ", log.LstdFlags|log.Lmsgprefix)
	o.Logf = logger.Printf

	in, err := installer.New(o)
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	ctx, cancel := signalContext()
	defer cancel()
	attached := false
	if *withFastpath {
		if attached, err = attachFastpath(logger); err != nil {
			return err
		}
	}
	err = in.Run(ctx)
	if err != nil {
		err = fmt.Errorf("install: %w", err)
	}
	if attached && o.CleanupOnExit {
		err = errors.Join(err, detachFastpath(logger))
	}
	return err
}

// attachFastpath attaches the fast path with istio's defaults. It reports
// whether this run attached it: one attached before (by `meshwire fastpath
// attach`, another container) is not this installer's to detach.
func attachFastpath(logger *log.Logger) (bool, error) {
	if os.Geteuid() != 0 {
		return false, errors.New("install --fastpath: must run as root (it loads BPF programs and attaches them to the cgroup v2 root)")
	}
	cfg := fastpath.Defaults()
	already, err := fastpath.Attach(cfg)
	if err != nil {
		return false, fmt.Errorf("install --fastpath: %w (nothing was changed)", err)
	}
	if already {
		logger.Printf("fast path already attached (%s); leaving it attached on exit", cfg.PinDir)
		return false, nil
	}
	logger.Printf("attached the fast path (pinned in %s)", cfg.PinDir)
	return true, nil
}

// detachFastpath detaches the fast path this run attached; sockets still on
// it go to the same holder process `meshwire fastpath detach` starts.
func detachFastpath(logger *log.Logger) error {
	d, err := fastpath.Detach(fastpath.DefaultPinDir)
	if err != nil {
		return fmt.Errorf("detach the fast path: %w", err)
	}
	if !d.WasAttached {
		logger.Printf("fast path was no longer attached")
		return nil
	}
	if d.Draining == nil {
		logger.Printf("detached the fast path")
		return nil
	}
	pid, err := startHolder(d.Draining)
	d.Draining.Close()
	if err != nil {
		return fmt.Errorf("detached the fast path, but the %d sockets still on it lose their unread bytes: %w", d.Live, err)
	}
	logger.Printf("detached the fast path; %d sockets keep it until they close (held by pid %d)", d.Live, pid)
	return nil
}
