// Package cniplugin is what every meshwire CNI plugin binary shares: its
// main (Main, Run) and the decoding of its config (Base, Decode, Unmarshal).
//
// Main puts the spec's checks in front of skel (a missing or unknown
// CNI_COMMAND is code 4, never a silent exit 0), answers VERSION with the
// supported spec versions plus the meshwire build, turns panics into CNI
// errors, and, when asked by the config or the environment, logs every
// command with its duration, its CPU time and outcome to a file (never to
// stdout).
package cniplugin

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/meshwire/meshwire/internal/buildinfo"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/killpoint"
	"github.com/meshwire/meshwire/internal/logging"
)

// Spec describes one plugin binary.
type Spec struct {
	Name     string             // the plugin type, e.g. "loopback"
	Versions version.PluginInfo // spec versions served
	Funcs    skel.CNIFuncs      // ADD, CHECK, DEL, GC, STATUS
}

// Commands the spec defines.
var commands = []string{"ADD", "CHECK", "DEL", "GC", "STATUS", "VERSION"}

// Main runs the plugin and exits.
func Main(s Spec) {
	os.Exit(Run(s, os.Getenv, os.Stdout, os.Stderr))
}

// cpuMs is the CPU time (user + system) this process has used so far,
// its start included, plus that of the children it has waited for (the
// IPAM plugin, iptables-restore, ...), in milliseconds. Unlike
// durationMs it does not count the time spent waiting for a CPU or a
// lock, so it is what the plugin costs the node whatever else runs beside
// it (the full-node benchmark bounds it); a spinning lock's wait is CPU
// time, though. -1 when getrusage fails.
func cpuMs() float64 {
	var self, children unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &self) != nil || unix.Getrusage(unix.RUSAGE_CHILDREN, &children) != nil {
		return -1
	}
	ns := self.Utime.Nano() + self.Stime.Nano() + children.Utime.Nano() + children.Stime.Nano()
	return float64(ns/1000) / 1000
}

// Run executes one CNI command and returns the process exit code. stdin is
// read by skel from os.Stdin.
func Run(s Spec, getenv func(string) string, stdout, stderr io.Writer) int {
	cmd := getenv("CNI_COMMAND")
	switch {
	case cmd == "":
		fmt.Fprintf(stderr, "%s\nCNI protocol versions supported: %s\n", buildinfo.String(s.Name), strings.Join(s.Versions.SupportedVersions(), ", "))
		return printErr(stdout, cnierr.InvalidEnv("CNI_COMMAND", "not set (want one of %s)", strings.Join(commands, ", ")))
	case !known(cmd):
		return printErr(stdout, cnierr.InvalidEnv("CNI_COMMAND", "unknown command %q (want one of %s)", cmd, strings.Join(commands, ", ")))
	case cmd == "VERSION":
		return printVersion(s, stdout)
	}
	funcs := skel.CNIFuncs{
		Add:    wrap(s.Name, "ADD", s.Funcs.Add, getenv),
		Check:  wrap(s.Name, "CHECK", s.Funcs.Check, getenv),
		Del:    wrap(s.Name, "DEL", s.Funcs.Del, getenv),
		GC:     wrap(s.Name, "GC", s.Funcs.GC, getenv),
		Status: wrap(s.Name, "STATUS", s.Funcs.Status, getenv),
	}
	if e := skel.PluginMainFuncsWithError(funcs, s.Versions, buildinfo.String(s.Name)); e != nil {
		return printErr(stdout, e)
	}
	return 0
}

func known(cmd string) bool {
	for _, c := range commands {
		if c == cmd {
			return true
		}
	}
	return false
}

func printErr(w io.Writer, e *types.Error) int {
	b, _ := json.MarshalIndent(e, "", "    ")
	fmt.Fprintf(w, "%s\n", b)
	return 1
}

// versionInfo is the spec's VERSION answer plus the meshwire build, which
// runtimes ignore and people read.
type versionInfo struct {
	CNIVersion        string   `json:"cniVersion"`
	SupportedVersions []string `json:"supportedVersions"`
	Implementation    string   `json:"implementation"`
}

func printVersion(s Spec, w io.Writer) int {
	b, _ := json.Marshal(versionInfo{
		CNIVersion:        version.Current(),
		SupportedVersions: s.Versions.SupportedVersions(),
		Implementation:    buildinfo.String(s.Name),
	})
	fmt.Fprintf(w, "%s\n", b)
	return 0
}

// wrap adds logging and panic recovery around one command. A nil function
// means the command has nothing to do for this plugin.
func wrap(name, cmd string, fn func(*skel.CmdArgs) error, getenv func(string) string) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) (err error) {
		var lc struct {
			Log *logging.Config `json:"log"`
		}
		_ = json.Unmarshal(args.StdinData, &lc) // bad configs are reported by the plugin's own decoding
		if lc.Log.Validate() != nil {
			lc.Log = nil
		}
		logger, closeLog, _ := logging.Open(lc.Log, getenv)
		defer closeLog()
		logger = logger.With("plugin", name, "command", cmd, logging.KeyContainerID, args.ContainerID, logging.KeyNetns, args.Netns, "ifname", args.IfName)
		slog.SetDefault(logger)
		start := time.Now()
		defer func() {
			attrs := []any{"durationMs", float64(time.Since(start).Microseconds()) / 1000, "cpuMs", cpuMs()}
			if err != nil {
				logger.Warn("failed", append(attrs, "code", cnierr.Code(err), "error", err.Error())...)
			} else {
				logger.Info("done", attrs...)
			}
		}()
		logger.Debug("start", "config", string(args.StdinData), "args", args.Args)
		if fn == nil {
			return nil
		}
		killpoint.SetCommand(name + ":" + cmd)
		killpoint.Here("enter")
		if err := cnierr.Catch(func() error { return fn(args) }); err != nil {
			return err
		}
		killpoint.Here("printed") // the result out, the exit status not yet
		return nil
	}
}
