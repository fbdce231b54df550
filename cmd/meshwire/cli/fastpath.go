package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/meshwire/meshwire/ebpf/bpfnode"
	"github.com/meshwire/meshwire/ebpf/capture"
	"github.com/meshwire/meshwire/ebpf/fastpath"
	"github.com/meshwire/meshwire/ebpf/loader"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/podstate"
)

// fastpathCmd is `meshwire fastpath attach|detach|status`.
func (e *env) fastpathCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "fastpath attach|detach|status",
		Short: "attach, detach or report the eBPF sockmap fast path",
		Long: "Load the eBPF sockmap fast path and attach it at the cgroup v2 root (attach), remove it\n" +
			"(detach; connections on it keep working until they close), or report it (status).\n" +
			"See docs/fastpath.md.",
		Args: cobra.ArbitraryArgs,
		RunE: func(c *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usagef("fastpath: want attach, detach or status")
			}
			return usagef("fastpath: unknown subcommand %q (want attach, detach or status)", args[0])
		},
	}
	c.AddCommand(e.fastpathAttachCmd(), e.fastpathDetachCmd(), e.fastpathStatusCmd())
	return c
}

// fastpathFlags binds the fast path's settings, which `fastpath attach` and
// `node` share; check validates them once the flags are parsed.
func fastpathFlags(fs *pflag.FlagSet, cfg *fastpath.Config) (check func(cmd string) error) {
	uid := fs.Uint("proxy-uid", uint(cfg.ProxyUID), "the sidecar's uid")
	gid := fs.String("proxy-gid", "", "also the sidecar's: sockets of this gid, whatever their uid")
	port := fs.Uint("outbound-port", uint(cfg.OutboundPort), "the sidecar's outbound capture port")
	fs.BoolVar(&cfg.IntoProxy, "into-proxy", false, "also hand the app's bytes to the proxy (only for proxies that read with recv/readv, never splice)")
	fs.StringVar(&cfg.PinDir, "pin-dir", cfg.PinDir, "bpffs directory for the pins")
	fs.StringVar(&cfg.Cgroup, "cgroup", "", "cgroup v2 directory to attach at (default: the cgroup2 mount; DIR/unified on hybrid hosts)")
	return func(cmd string) error {
		if *uid > 1<<31-2 {
			return usagef("%s: --proxy-uid %d is not a uid", cmd, *uid)
		}
		if *port == 0 || *port > 65535 {
			return usagef("%s: --outbound-port %d is not a TCP port (1-65535)", cmd, *port)
		}
		cfg.ProxyUID, cfg.OutboundPort = uint32(*uid), uint16(*port)
		if *gid != "" {
			g, err := strconv.ParseUint(*gid, 10, 32)
			if err != nil || g > 1<<31-2 {
				return usagef("%s: --proxy-gid %q is not a gid", cmd, *gid)
			}
			g32 := uint32(g)
			cfg.ProxyGID = &g32
		}
		return nil
	}
}

func (e *env) fastpathAttachCmd() *cobra.Command {
	cfg := fastpath.Defaults()
	c := leafCmd("attach", "load the eBPF sockmap fast path and attach it at the cgroup v2 root", "")
	check := fastpathFlags(c.Flags(), &cfg)
	c.RunE = func(*cobra.Command, []string) error {
		if err := check("fastpath attach"); err != nil {
			return err
		}
		return e.fastpathAttach(cfg)
	}
	return c
}

func (e *env) fastpathAttach(cfg fastpath.Config) error {
	if os.Geteuid() != 0 {
		return errors.New("fastpath attach: must run as root (it loads BPF programs and attaches them to the cgroup v2 root)")
	}
	// The ebpf interception programs (pods opt in with EBPF mode) go with
	// the fast path, after it; their failure leaves the fast path attached.
	r, err := bpfnode.Attach(bpfnode.Options{Fastpath: cfg})
	if r.Failed == bpfnode.StepFastpath {
		return fmt.Errorf("fastpath attach: %w (nothing was changed; pods keep working through the interception rules)", err)
	}
	switch r.Fastpath {
	case loader.AlreadyAttached:
		fmt.Fprintf(e.out, "fast path already attached (%s)\n", cfg.PinDir)
	case loader.Replaced:
		fmt.Fprintf(e.out, "fast path of another meshwire build replaced by this one's (pinned in %s; its connections keep the old one until they close)\n", cfg.PinDir)
	default:
		fmt.Fprintf(e.out, "fast path attached (pinned in %s)\n", cfg.PinDir)
	}
	if r.Fresh {
		// The meshed pods' fast-path policies and copies of their
		// interception settings, from their records (moved from an
		// earlier version's stores first); a failure is reported, not
		// fatal.
		store := podstate.New(nodelayout.Default())
		m, rp, err := store.Restore(cfg.PinDir, netns.Live)
		if m.Any() {
			fmt.Fprintf(e.out, "moved an earlier version's records of the pods into %s\n", store.Dir())
		}
		if rp.Pods > 0 || rp.Dropped > 0 {
			fmt.Fprintf(e.out, "meshed pods' policies restored from %s: %d (%d of namespaces gone, removed)\n", store.Dir(), rp.Pods, rp.Dropped)
		}
		if err != nil {
			fmt.Fprintf(e.out, "warning: restoring the meshed pods' policies: %v\n", err)
		}
	}
	switch {
	case err != nil:
		return fmt.Errorf("fastpath attach: the fast path is attached, the ebpf interception programs are not: %w", err)
	case r.Capture == loader.AlreadyAttached:
		fmt.Fprintf(e.out, "ebpf interception already attached (%s)\n", capture.DefaultPinDir)
	case r.Capture == loader.Replaced:
		fmt.Fprintf(e.out, "ebpf interception programs of another meshwire build replaced in place (%s)\n", capture.DefaultPinDir)
	default:
		fmt.Fprintf(e.out, "ebpf interception attached (pinned in %s)\n", capture.DefaultPinDir)
	}
	if dir, others, err := fastpath.OtherSockops(cfg.Cgroup); err == nil && len(others) > 0 {
		fmt.Fprintf(e.out, "warning: other sockops programs are attached at %s: %s; they see the same sockets, and one that redirects their messages competes with the fast path\n", dir, describePrograms(others))
	}
	return nil
}

// describePrograms names programs for a message: "id 12 (name, tag ...)".
func describePrograms(ps []fastpath.Program) string {
	var parts []string
	for _, p := range ps {
		parts = append(parts, fmt.Sprintf("id %d (%s, tag %s)", p.ID, p.Name, p.Tag))
	}
	return strings.Join(parts, ", ")
}

func (e *env) fastpathDetachCmd() *cobra.Command {
	var dir string
	var force bool
	c := leafCmd("detach", "remove the fast path (connections on it keep working until they close)", "")
	c.RunE = func(*cobra.Command, []string) error { return e.fastpathDetach(dir, force) }
	c.Flags().StringVar(&dir, "pin-dir", fastpath.DefaultPinDir, "bpffs directory of the pins")
	c.Flags().BoolVar(&force, "force", false, "also detach the ebpf interception programs while pods use them (their new connections then bypass their sidecars)")
	return c
}

func (e *env) fastpathDetach(dir string, force bool) error {
	if os.Geteuid() != 0 {
		return errors.New("fastpath detach: must run as root")
	}
	switch was, err := capture.Detach("", force); {
	case err != nil:
		fmt.Fprintf(e.out, "ebpf interception left attached: %v\n", err)
	case was:
		fmt.Fprintln(e.out, "ebpf interception detached")
	}
	d, err := fastpath.Detach(dir)
	if err != nil {
		return fmt.Errorf("fastpath detach: %w", err)
	}
	if !d.WasAttached {
		fmt.Fprintln(e.out, "fast path not attached")
		return nil
	}
	if d.Live == 0 {
		fmt.Fprintln(e.out, "fast path detached")
		return nil
	}
	fmt.Fprintf(e.out, "fast path detached; %d sockets keep it until they close\n", d.Live)
	return nil
}

func (e *env) fastpathStatusCmd() *cobra.Command {
	var format outputFormat
	var asJSON bool
	var dir, cgroup string
	c := leafCmd("status", "whether the fast path is attached, with its counters", "")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if asJSON {
			if c.Flags().Changed("output") && format != "json" {
				return usagef("fastpath status: --json is -o json, not -o %s", format)
			}
			format = "json"
		}
		return e.fastpathStatus(format == "json", dir, cgroup)
	}
	format.bind(c)
	c.Flags().BoolVar(&asJSON, "json", false, "print one JSON object: the same as -o json")
	c.Flags().StringVar(&dir, "pin-dir", fastpath.DefaultPinDir, "bpffs directory of the pins")
	c.Flags().StringVar(&cgroup, "cgroup", "", "cgroup v2 directory to list other sockops programs at (default: the cgroup2 mount)")
	return c
}

func (e *env) fastpathStatus(asJSON bool, dir, cgroup string) error {
	st, err := fastpath.ReadStatus(dir)
	if err != nil {
		return fmt.Errorf("fastpath status: %w", err)
	}
	cgDir, others, othersErr := fastpath.OtherSockops(cgroup)
	cst, err := capture.ReadStatus("")
	if err != nil {
		return fmt.Errorf("fastpath status: %w", err)
	}
	if asJSON {
		out := struct {
			fastpath.Status
			OtherSockops []fastpath.Program `json:"other_sockops,omitempty"`
			Capture      capture.Status     `json:"ebpf_interception"`
		}{st, others, cst}
		return json.NewEncoder(e.out).Encode(out)
	}
	if cst.Attached {
		c := cst.Counters
		fmt.Fprintf(e.out, "ebpf interception: attached (%s), %d pods; redirected %d outbound, %d to the pod's inbound port, %d inbound SYNs (%d dropped, no listener); %d SO_ORIGINAL_DST answers\n",
			cst.PinDir, cst.Pods, c.Outbound, c.InboundLo, c.Inbound, c.NoListener, c.Answers)
	} else {
		fmt.Fprintf(e.out, "ebpf interception: not attached (%s)\n", cst.PinDir)
	}
	if !st.Attached {
		fmt.Fprintf(e.out, "fast path: not attached (%s)\n", st.PinDir)
		return nil
	}
	tw := tabwriter.NewWriter(e.out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "fast path:\tattached (%s)\n", st.PinDir)
	fmt.Fprintf(tw, "proxy uid, outbound port:\t%d, %d (into proxy: %v)\n", st.ProxyUID, st.OutboundPort, st.IntoProxy)
	if st.KernelSplices {
		fmt.Fprintf(tw, "kernel splices redirected bytes:\tyes (every proxy is fed)\n")
	}
	if st.ProxyGID != nil {
		fmt.Fprintf(tw, "proxy gid:\t%d\n", *st.ProxyGID)
	}
	fmt.Fprintf(tw, "sockets now / since attach:\t%d / %d\n", st.LiveSockets, st.Sockets)
	fmt.Fprintf(tw, "connections paired:\t%d (sidecar to sidecar: %d)\n", st.Pairs, st.PeerPairs)
	fmt.Fprintf(tw, "messages, bytes redirected:\t%d, %d\n", st.RedirectedMessages, st.RedirectedBytes)
	fmt.Fprintf(tw, "messages on TCP (fallbacks):\t%d (to the proxy, kept: %d)\n", st.Fallbacks, st.KeptForProxy)
	fmt.Fprintf(tw, "ambiguous endpoints:\t%d\n", st.Ambiguous)
	fmt.Fprintf(tw, "pod policies:\t%d\n", st.PodPolicies)
	fmt.Fprintf(tw, "cgroup id:\t%d\n", st.CgroupID)
	switch {
	case othersErr != nil:
		fmt.Fprintf(tw, "other sockops programs:\tunknown (%v)\n", othersErr)
	case len(others) == 0:
		fmt.Fprintf(tw, "other sockops programs:\tnone (at %s)\n", cgDir)
	default:
		fmt.Fprintf(tw, "other sockops programs:\t%s (at %s)\n", describePrograms(others), cgDir)
	}
	return tw.Flush()
}
