// Package cli is the meshwire command line: add, check, del, ls, gc, demo,
// fastpath, install, node.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/meshwire/meshwire/internal/buildinfo"
	"github.com/meshwire/meshwire/internal/cniruntime"
	"github.com/meshwire/meshwire/internal/demo"
)

const usage = `usage: meshwire COMMAND [flags]

commands:
  add NAME [--conf FILE] [--ifname IF] [--port [HOSTIP:]HOST:CONTAINER[/tcp|udp|sctp]]... [--bandwidth RATE]
                 create network namespace NAME (if absent) and wire it with the conflist
  check NAME     run CNI CHECK for NAME's attachments
  del NAME       run CNI DEL for NAME's attachments and remove the namespace meshwire created
  ls             list the namespaces meshwire manages, with their addresses
  gc [--conf FILE]
                 CNI GC of every known network, keeping the attachments meshwire manages
  demo [--conf FILE] [--hold DURATION]
                 wire two namespaces with the default conflist, show what works, clean up
                 (after DURATION, or at once on Ctrl-C)
  fastpath attach [--proxy-uid UID] [--proxy-gid GID] [--outbound-port PORT] [--into-proxy]
                 load the eBPF sockmap fast path and attach it at the cgroup v2 root
  fastpath detach
                 remove it (connections on it keep working until they close)
  fastpath status [--json]
                 whether it is attached, with its counters
  install --cni-bin-dir DIR --cni-conf-dir DIR [--chain] [--once] [--cleanup-on-exit]
          [--source-dir DIR] [--fastpath] [--conflist FILE] [--pod-cidr CIDR]...
          [--cni-version V] [--intercept]
                 node installer (a DaemonSet's container): copy the plugins into the CNI bin
                 dir, write meshwire's conflist (or --conflist; subnets from --pod-cidr, intercept at its
                 end with --intercept) or, with --chain, chain intercept into the node's
                 primary config; keep it applied until SIGTERM (--once: apply, exit)
  node --cni-bin-dir DIR --cni-conf-dir DIR [--chain] [--cleanup-on-exit] [--fastpath]
       [--listen ADDR] [--plugin-log FILE] [--interval DURATION]
                 node agent (a DaemonSet's one container): the installer's work, the fast
                 path attached and kept attached, /healthz, /readyz and /metrics on ADDR
                 (default 127.0.0.1:9966); on SIGTERM detaches and cleans up
  version        print the meshwire version

global flags (anywhere on the line):
  --cni-path DIRS   colon-separated plugin directories (default: the directory of
                    the meshwire binary, then /opt/cni/bin)
  --state-dir DIR   where meshwire keeps its records and libcni's cache
                    (default /var/lib/meshwire)
`

// defaultStateDir is where meshwire keeps its records (--state-dir).
const defaultStateDir = "/var/lib/meshwire"

// errUsage marks errors that exit 2.
var errUsage = errors.New("usage")

type usageError struct{ msg string }

func (e usageError) Error() string   { return e.msg }
func (e usageError) Is(t error) bool { return t == errUsage }

func usagef(format string, a ...any) error { return usageError{fmt.Sprintf(format, a...)} }

// env is what every command gets.
type env struct {
	out, errOut     io.Writer
	defaultConflist []byte
	cniPath         string
	stateDir        string
}

// Main runs the command line and returns the exit code: 0, 1 for a failure,
// 2 for a usage error. Errors are one line on stderr.
func Main(args []string, defaultConflist []byte, stdout, stderr io.Writer) int {
	e := &env{out: stdout, errOut: stderr, defaultConflist: defaultConflist, stateDir: defaultStateDir}
	err := run(e, args)
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		fmt.Fprintf(stderr, "meshwire: %v\nrun `meshwire help` for usage\n", err)
		return 2
	default:
		fmt.Fprintf(stderr, "meshwire: %s\n", cniruntime.OneLine(err))
		return 1
	}
}

// extractGlobals removes the global flags from anywhere on the line.
func (e *env) extractGlobals(args []string) ([]string, error) {
	var rest []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || (name != "cni-path" && name != "state-dir") {
			rest = append(rest, a)
			continue
		}
		if !hasVal {
			if i+1 >= len(args) {
				return nil, usagef("flag --%s needs a value", name)
			}
			i++
			val = args[i]
		}
		if name == "cni-path" {
			e.cniPath = val
		} else {
			e.stateDir = val
		}
	}
	return rest, nil
}

func run(e *env, args []string) error {
	args, err := e.extractGlobals(args)
	if err != nil {
		return err
	}
	if len(args) == 0 {
		fmt.Fprint(e.errOut, usage)
		return usagef("no command given")
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "help", "-h", "--help":
		fmt.Fprint(e.out, usage)
		return nil
	case "version", "--version":
		fmt.Fprintln(e.out, buildinfo.String("command"))
		return nil
	case "add":
		return e.add(rest)
	case "check":
		return e.check(rest)
	case "del":
		return e.del(rest)
	case "ls":
		return e.ls(rest)
	case "gc":
		return e.gc(rest)
	case "demo":
		return e.demo(rest)
	case "fastpath":
		return e.fastpath(rest)
	case "install":
		return e.install(rest)
	case "node":
		return e.node(rest)
	}
	return usagef("unknown command %q", cmd)
}

// flags returns a flag set with the global flags bound.
func (e *env) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parse parses flags and positional arguments in any order and checks the
// number of positionals.
func parse(fs *flag.FlagSet, args []string, positionals int) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, usagef("%s: %v", fs.Name(), err)
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
	if len(pos) != positionals {
		if positionals == 1 {
			return nil, usagef("%s: want exactly one namespace NAME, got %d arguments", fs.Name(), len(pos))
		}
		return nil, usagef("%s: takes no arguments, got %q", fs.Name(), pos)
	}
	return pos, nil
}

func (e *env) runtime() (*cniruntime.Runtime, error) {
	if os.Geteuid() != 0 {
		return nil, errors.New("must run as root (it creates network namespaces and runs CNI plugins)")
	}
	return cniruntime.New(e.stateDir, e.pluginPath()), nil
}

// pluginPath is --cni-path, or the binary's own directory then /opt/cni/bin.
func (e *env) pluginPath() []string {
	if e.cniPath != "" {
		return filepath.SplitList(e.cniPath)
	}
	var dirs []string
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Dir(exe))
	}
	return append(dirs, "/opt/cni/bin")
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

func (e *env) add(args []string) error {
	fs := e.flags("add")
	conf := fs.String("conf", "", "conflist file")
	ifName := fs.String("ifname", "eth0", "pod interface name")
	var ports multiFlag
	fs.Var(&ports, "port", "host port mapping")
	bw := fs.String("bandwidth", "", "rate limit")
	pos, err := parse(fs, args, 1)
	if err != nil {
		return err
	}
	caps, err := cniruntime.CapabilityArgs(ports, *bw)
	if err != nil {
		return usagef("%v", err)
	}
	conflist := e.defaultConflist
	if *conf != "" {
		if conflist, err = os.ReadFile(*conf); err != nil {
			return fmt.Errorf("--conf: %w", err)
		}
	}
	rt, err := e.runtime()
	if err != nil {
		return err
	}
	ctx, cancel := signalContext()
	defer cancel()
	rec, _, err := rt.Add(ctx, pos[0], conflist, *ifName, caps)
	if err != nil {
		return fmt.Errorf("add %s: %w", pos[0], err)
	}
	fmt.Fprintf(e.out, "%s: wired (netns %s, container id %s)\n", rec.Name, rec.NetNS, rec.ContainerID[:12])
	rt.WriteResults(e.out, rec)
	return nil
}

// podCommand parses "CMD NAME" and runs fn with the runtime and a context
// that an interrupt cancels.
func (e *env) podCommand(cmd string, args []string, fn func(ctx context.Context, rt *cniruntime.Runtime, name string) error) error {
	pos, err := parse(e.flags(cmd), args, 1)
	if err != nil {
		return err
	}
	rt, err := e.runtime()
	if err != nil {
		return err
	}
	ctx, cancel := signalContext()
	defer cancel()
	if err := fn(ctx, rt, pos[0]); err != nil {
		return fmt.Errorf("%s %s: %w", cmd, pos[0], err)
	}
	return nil
}

func (e *env) check(args []string) error {
	return e.podCommand("check", args, func(ctx context.Context, rt *cniruntime.Runtime, name string) error {
		if err := rt.Check(ctx, name); err != nil {
			return err
		}
		fmt.Fprintf(e.out, "%s: ok\n", name)
		return nil
	})
}

func (e *env) del(args []string) error {
	return e.podCommand("del", args, func(ctx context.Context, rt *cniruntime.Runtime, name string) error {
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

func (e *env) ls(args []string) error {
	if _, err := parse(e.flags("ls"), args, 0); err != nil {
		return err
	}
	rt, err := e.runtime()
	if err != nil {
		return err
	}
	recs, err := rt.List()
	if err != nil {
		return err
	}
	cniruntime.WriteTable(e.out, recs)
	return nil
}

func (e *env) gc(args []string) error {
	fs := e.flags("gc")
	conf := fs.String("conf", "", "also GC this conflist's network")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	extra := [][]byte{e.defaultConflist}
	if *conf != "" {
		b, err := os.ReadFile(*conf)
		if err != nil {
			return fmt.Errorf("--conf: %w", err)
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

// demo runs the demo (internal/demo) with the default conflist or --conf,
// on its own state dir unless --state-dir names one.
func (e *env) demo(args []string) error {
	fs := e.flags("demo")
	hold := fs.Duration("hold", 0, "keep the pods up this long before cleaning up")
	conf := fs.String("conf", "", "demo this conflist instead of the default")
	if _, err := parse(fs, args, 0); err != nil {
		return err
	}
	conflist := e.defaultConflist
	if *conf != "" {
		var err error
		if conflist, err = os.ReadFile(*conf); err != nil {
			return fmt.Errorf("--conf: %w", err)
		}
	}
	if e.stateDir == defaultStateDir {
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
