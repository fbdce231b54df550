package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/meshwire/meshwire/ebpf/fastpath"
)

const fastpathUsage = `usage: meshwire fastpath attach [--proxy-uid UID] [--outbound-port PORT] [--into-proxy] [--pin-dir DIR] [--cgroup DIR]
       meshwire fastpath detach [--pin-dir DIR]
       meshwire fastpath status [--json] [--pin-dir DIR]`

// fastpath runs `meshwire fastpath attach|detach|status`.
func (e *env) fastpath(args []string) error {
	if len(args) == 0 {
		return usagef("fastpath: want attach, detach or status\n%s", fastpathUsage)
	}
	sub, rest := args[0], args[1:]
	switch sub {
	case "attach":
		return e.fastpathAttach(rest)
	case "detach":
		return e.fastpathDetach(rest)
	case "status":
		return e.fastpathStatus(rest)
	}
	return usagef("fastpath: unknown subcommand %q (want attach, detach or status)", sub)
}

// fastpathFlags binds the fast path's settings, which `fastpath attach` and
// `node` share; check validates them once the flags are parsed.
func fastpathFlags(fs *flag.FlagSet, cfg *fastpath.Config) (check func(cmd string) error) {
	uid := fs.Uint("proxy-uid", uint(cfg.ProxyUID), "the sidecar's uid")
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
		return nil
	}
}

func (e *env) fastpathAttach(args []string) error {
	cfg := fastpath.Defaults()
	fs := e.flags("fastpath attach")
	check := fastpathFlags(fs, &cfg)
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	if err := check("fastpath attach"); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("fastpath attach: must run as root (it loads BPF programs and attaches them to the cgroup v2 root)")
	}
	res, err := fastpath.Attach(cfg)
	if err != nil {
		return fmt.Errorf("fastpath attach: %w (nothing was changed; pods keep working through the interception rules)", err)
	}
	switch res {
	case fastpath.AlreadyAttached:
		fmt.Fprintf(e.out, "fast path already attached (%s)\n", cfg.PinDir)
		return nil
	case fastpath.Replaced:
		fmt.Fprintf(e.out, "fast path of another meshwire build replaced by this one's (pinned in %s; its connections keep the old one until they close)\n", cfg.PinDir)
		return nil
	}
	fmt.Fprintf(e.out, "fast path attached (pinned in %s)\n", cfg.PinDir)
	return nil
}

func (e *env) fastpathDetach(args []string) error {
	fs := e.flags("fastpath detach")
	dir := fs.String("pin-dir", fastpath.DefaultPinDir, "bpffs directory of the pins")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("fastpath detach: must run as root")
	}
	d, err := fastpath.Detach(*dir)
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

func (e *env) fastpathStatus(args []string) error {
	fs := e.flags("fastpath status")
	asJSON := fs.Bool("json", false, "print one JSON object")
	dir := fs.String("pin-dir", fastpath.DefaultPinDir, "bpffs directory of the pins")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	st, err := fastpath.ReadStatus(*dir)
	if err != nil {
		return fmt.Errorf("fastpath status: %w", err)
	}
	if *asJSON {
		return json.NewEncoder(e.out).Encode(st)
	}
	if !st.Attached {
		fmt.Fprintf(e.out, "fast path: not attached (%s)\n", st.PinDir)
		return nil
	}
	tw := tabwriter.NewWriter(e.out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "fast path:\tattached (%s)\n", st.PinDir)
	fmt.Fprintf(tw, "proxy uid, outbound port:\t%d, %d (into proxy: %v)\n", st.ProxyUID, st.OutboundPort, st.IntoProxy)
	fmt.Fprintf(tw, "sockets now / since attach:\t%d / %d\n", st.LiveSockets, st.Sockets)
	fmt.Fprintf(tw, "connections paired:\t%d\n", st.Pairs)
	fmt.Fprintf(tw, "messages, bytes redirected:\t%d, %d\n", st.RedirectedMessages, st.RedirectedBytes)
	fmt.Fprintf(tw, "messages on TCP (fallbacks):\t%d (to the proxy, kept: %d)\n", st.Fallbacks, st.KeptForProxy)
	fmt.Fprintf(tw, "ambiguous endpoints:\t%d\n", st.Ambiguous)
	fmt.Fprintf(tw, "pod policies:\t%d\n", st.PodPolicies)
	return tw.Flush()
}
