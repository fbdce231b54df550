package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/meshwire/meshwire/internal/cniruntime"
	"github.com/meshwire/meshwire/internal/crigc"
	"github.com/meshwire/meshwire/internal/demo"
	"github.com/meshwire/meshwire/internal/nodelayout"
)

// The pod commands: add, check, del, ls, gc and demo.

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }
func (m *multiFlag) Type() string       { return "stringArray" }

func (e *env) addCmd() *cobra.Command {
	var conf, ifName, bw string
	var ports multiFlag
	c := &cobra.Command{
		Use:   "add NAME",
		Short: "create network namespace NAME (if absent) and wire it with the conflist",
		Long: "Create network namespace NAME (or adopt it if it exists) and wire it as a runtime does:\n" +
			"the loopback network on lo, then the conflist on --ifname. A failed add undoes itself.",
		Args:              oneName,
		ValidArgsFunction: cobra.NoFileCompletions,
		RunE: func(c *cobra.Command, args []string) error {
			caps, err := cniruntime.CapabilityArgs(ports, bw)
			if err != nil {
				return usagef("%v", err)
			}
			conflist, err := e.conflist(conf)
			if err != nil {
				return err
			}
			rt, err := e.runtime()
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			rec, _, err := rt.Add(ctx, args[0], conflist, ifName, caps)
			if err != nil {
				return fmt.Errorf("add %s: %w", args[0], err)
			}
			fmt.Fprintf(e.out, "%s: wired (netns %s, container id %s)\n", rec.Name, rec.NetNS, rec.ContainerID[:12])
			rt.WriteResults(e.out, rec)
			return nil
		},
	}
	fs := c.Flags()
	fs.StringVar(&conf, "conf", "", "conflist file to wire the namespace with (default: the embedded default conflist, cmd/meshwire/default.conflist)")
	fs.StringVar(&ifName, "ifname", "eth0", "name of the pod's interface the conflist creates")
	fs.Var(&ports, "port", "host port mapping, TCP unless /udp or /sctp; repeatable")
	fs.StringVar(&bw, "bandwidth", "", "ingress and egress rate limit, e.g. 10mbit, 1gbit, 500kbit")
	return c
}

// podCommand is "CMD NAME": fn runs with the runtime and a context that
// an interrupt cancels.
func (e *env) podCommand(use, short string, fn func(ctx context.Context, rt *cniruntime.Runtime, name string) error) *cobra.Command {
	return &cobra.Command{
		Use:               use + " NAME",
		Short:             short,
		Args:              oneName,
		ValidArgsFunction: e.completePods,
		RunE: func(c *cobra.Command, args []string) error {
			rt, err := e.runtime()
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			if err := fn(ctx, rt, args[0]); err != nil {
				return fmt.Errorf("%s %s: %w", use, args[0], err)
			}
			return nil
		},
	}
}

// completePods offers the names of the namespaces meshwire wired (their
// records' names in the state directory).
func (e *env) completePods(_ *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	files, _ := filepath.Glob(filepath.Join(e.stateDir, "pods", "*.json"))
	var names []cobra.Completion
	for _, f := range files {
		if n := strings.TrimSuffix(filepath.Base(f), ".json"); strings.HasPrefix(n, toComplete) {
			names = append(names, n)
		}
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}

func (e *env) checkCmd() *cobra.Command {
	return e.podCommand("check", "run CNI CHECK for NAME's attachments", func(ctx context.Context, rt *cniruntime.Runtime, name string) error {
		if err := rt.Check(ctx, name); err != nil {
			return err
		}
		fmt.Fprintf(e.out, "%s: ok\n", name)
		return nil
	})
}

func (e *env) delCmd() *cobra.Command {
	return e.podCommand("del", "run CNI DEL for NAME's attachments and remove the namespace meshwire created", func(ctx context.Context, rt *cniruntime.Runtime, name string) error {
		rec, err := rt.Del(ctx, name)
		if err != nil {
			return err
		}
		what := "namespace removed"
		if !rec.CreatedNetNS {
			what = "namespace kept (meshwire did not create it)"
		}
		fmt.Fprintf(e.out, "%s: deleted, %s\n", rec.Name, what)
		return nil
	})
}

func (e *env) lsCmd() *cobra.Command {
	var format outputFormat
	c := leafCmd("ls", "list the namespaces meshwire manages, with their addresses", "")
	c.RunE = func(*cobra.Command, []string) error {
		rt, err := e.runtime()
		if err != nil {
			return err
		}
		recs, err := rt.List()
		if err != nil {
			return err
		}
		if format == "json" {
			return cniruntime.WriteJSON(e.out, recs)
		}
		cniruntime.WriteTable(e.out, recs)
		return nil
	}
	format.bind(c)
	return c
}

func (e *env) gcCmd() *cobra.Command {
	var conf string
	var o crigc.Options
	c := leafCmd("gc", "CNI GC of the networks meshwire wired, or (--cri-socket) of the node's against the runtime's pod sandboxes",
		"Without --cri-socket: CNI GC of the default conflist's network, --conf's and those of the\n"+
			"namespaces meshwire wired, keeping the attachments meshwire manages.\n\n"+
			"With --cri-socket, what a runtime that calls GC does (containerd 2.4 does not): CNI GC of\n"+
			"the node's network (--conf, or the first conflist of --cni-conf-dir, as containerd picks)\n"+
			"against the pod sandboxes the runtime lists over CRI, keeping too every attachment made\n"+
			"less than --min-age before the listing (the runtime's cache in --cni-cache-dir, host-local's\n"+
			"allocations, the pods' records in --node-state-dir): a sandbox whose ADD is under way is in\n"+
			"no list yet. Stale cached attachments get their DEL; then every plugin's GC runs.")
	c.RunE = func(c *cobra.Command, _ []string) error {
		if o.CRISocket != "" {
			return e.criGC(c, conf, o)
		}
		for _, f := range []string{"min-age", "cni-conf-dir", "cni-cache-dir", "ifname", "node-state-dir"} {
			if c.Flags().Changed(f) {
				return usagef("gc: --%s is for a GC against a runtime's pod sandboxes: it needs --cri-socket", f)
			}
		}
		extra := [][]byte{e.defaultConflist}
		if conf != "" {
			b, err := e.conflist(conf)
			if err != nil {
				return err
			}
			extra = append(extra, b)
		}
		rt, err := e.runtime()
		if err != nil {
			return err
		}
		ctx, cancel := signalContext()
		defer cancel()
		nets, err := rt.GC(ctx, extra...)
		if err != nil {
			return fmt.Errorf("gc: %w", err)
		}
		fmt.Fprintf(e.out, "gc done for networks: %s\n", strings.Join(nets, ", "))
		return nil
	}
	fs := c.Flags()
	fs.StringVar(&conf, "conf", "", "also GC this conflist's network (the default conflist's network and those of the wired namespaces always are); with --cri-socket, the node's network to GC, in place of the first conflist of --cni-conf-dir")
	fs.StringVar(&o.CRISocket, "cri-socket", "", "GC the node's network against the pod sandboxes the runtime at this CRI socket lists (containerd's /run/containerd/containerd.sock)")
	fs.DurationVar(&o.MinAge, "min-age", crigc.DefaultMinAge, "with --cri-socket: keep every attachment made less than this before the listing, whether the runtime lists it or not (its ADD may be under way); above the runtime's CNI timeout")
	fs.StringVar(&o.IfName, "ifname", crigc.DefaultIfName, "with --cri-socket: the interface the runtime gives each sandbox's network")
	criGCDirFlags(fs, &o)
	return c
}

// criGCDirFlags are the node's directories a GC against the runtime's
// sandboxes reads (gc --cri-socket, node --gc-cri-socket).
func criGCDirFlags(fs *pflag.FlagSet, o *crigc.Options) {
	if fs.Lookup("cni-conf-dir") == nil {
		fs.StringVar(&o.ConfDir, "cni-conf-dir", crigc.DefaultConfDir, "with --cri-socket: the runtime's CNI config directory, whose first conflist is the node's network")
	}
	fs.StringVar(&o.CacheDir, "cni-cache-dir", crigc.DefaultCacheDir, "with --cri-socket: the runtime's libcni cache directory (results/ in it)")
	if fs.Lookup("node-state-dir") == nil {
		fs.StringVar(&o.NodeState.Root, "node-state-dir", nodelayout.StateDir, "where the pods' records and ambient mode's socket are, as the plugins keep them")
	}
}

// criGC is gc --cri-socket: every input checked before anything changes.
func (e *env) criGC(c *cobra.Command, conf string, o crigc.Options) error {
	if o.MinAge < 0 {
		return usagef("gc: --min-age: must not be negative, got %s", o.MinAge)
	}
	if o.IfName == "" {
		return usagef("gc: --ifname: must not be empty")
	}
	if _, err := crigc.SocketPath(o.CRISocket); err != nil {
		return usagef("gc: --cri-socket: %v", err)
	}
	if conf != "" {
		o.ConfDir = ""
	}
	l, path, err := crigc.Network(o.ConfDir, conf)
	if err != nil {
		if conf != "" {
			return usagef("gc: --conf: %v", err)
		}
		return usagef("gc: --cni-conf-dir: %v", err)
	}
	if os.Geteuid() != 0 {
		return errors.New("gc --cri-socket: must run as root (it runs CNI plugins)")
	}
	o.Networks = []*libcni.NetworkConfigList{l}
	o.CNIPath = e.pluginPath()
	ctx, cancel := signalContext()
	defer cancel()
	r, err := crigc.Run(ctx, o)
	if r != nil {
		fmt.Fprintf(e.out, "network config %s\n", path)
		r.Write(e.out, o.MinAge)
	}
	if err != nil {
		return fmt.Errorf("gc: %w", err)
	}
	return nil
}

// demoCmd runs the demo (internal/demo) with the default conflist or
// --conf, on its own state dir unless --state-dir names one.
func (e *env) demoCmd() *cobra.Command {
	var conf string
	c := leafCmd("demo", "wire two namespaces with the default conflist, show what works, clean up",
		"Wire two namespaces (and a meshed third one, and a fourth in Istio's ambient mode) with\n"+
			"the default conflist or --conf, show what works, clean up (after --hold, or at once on\n"+
			"Ctrl-C). Without --state-dir the demo keeps its records in "+demo.StateDir+".")
	hold := c.Flags().Duration("hold", 0, "keep the pods up this long before cleaning up")
	c.Flags().StringVar(&conf, "conf", "", "conflist file to demo (default: the embedded default conflist)")
	c.RunE = func(c *cobra.Command, _ []string) error {
		conflist, err := e.conflist(conf)
		if err != nil {
			return err
		}
		if !c.Flags().Changed("state-dir") {
			e.stateDir = demo.StateDir
		}
		rt, err := e.runtime()
		if err != nil {
			return err
		}
		ctx, cancel := signalContext()
		defer cancel()
		return demo.Run(ctx, demo.Options{Conflist: conflist, Runtime: rt, Out: e.out, ErrOut: e.errOut, Hold: *hold})
	}
	return c
}

// conflist reads the conflist --conf names, or gives the default one.
func (e *env) conflist(conf string) ([]byte, error) {
	if conf == "" {
		return e.defaultConflist, nil
	}
	b, err := os.ReadFile(conf)
	if err != nil {
		return nil, fmt.Errorf("--conf: %w", err)
	}
	return b, nil
}

// outputFormat is -o/--output: table (the default) or json.
type outputFormat string

func (f *outputFormat) String() string { return string(*f) }
func (f *outputFormat) Type() string   { return "format" }
func (f *outputFormat) Set(v string) error {
	if v != "table" && v != "json" {
		return fmt.Errorf("want table or json, got %q", v)
	}
	*f = outputFormat(v)
	return nil
}

// bind adds -o/--output to c, with its completion.
func (f *outputFormat) bind(c *cobra.Command) {
	*f = "table"
	c.Flags().VarP(f, "output", "o", "output format: table or json")
	_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]cobra.Completion{"table", "json"}, cobra.ShellCompDirectiveNoFileComp))
}
