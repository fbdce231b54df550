// Package cli is the meshwire command line: add, check, del, ls, gc, demo,
// fastpath, install, node, completion, version. The commands are cobra
// commands (root.go); their flags, with the notes of usage.go (flagNotes), make
// both every command's usage (usage.go) and the flag tables of
// docs/meshwire.md (doctable.go).
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/meshwire/meshwire/internal/cniruntime"
	"github.com/meshwire/meshwire/internal/nodelayout"
)

// defaultStateDir is where meshwire keeps its records (--state-dir).
const defaultStateDir = nodelayout.CommandDir

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
// 2 for a usage error. Help (-h, --help, `help CMD`) goes to stdout; an
// error is one line on stderr, followed by the command's usage for a usage
// error.
func Main(args []string, defaultConflist []byte, stdout, stderr io.Writer) int {
	e := &env{out: stdout, errOut: stderr, defaultConflist: defaultConflist, stateDir: defaultStateDir}
	return execute(newRoot(e), args, stdout, stderr)
}

// execute runs root's command tree on args.
func execute(root *cobra.Command, args []string, stdout, stderr io.Writer) int {
	root.SetArgs(goFlagStyle(root, args))
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage):
		if cmd == nil {
			cmd = root
		}
		fmt.Fprintf(stderr, "meshwire: %v\n\n%s", err, usage(cmd))
		return 2
	default:
		fmt.Fprintf(stderr, "meshwire: %s\n", cniruntime.OneLine(err))
		return 1
	}
}

// goFlagStyle rewrites the single-dash long flags Go's flag package
// accepted (-cni-bin-dir=DIR, -json, -help) into pflag's double-dash form,
// for every long flag name of the command tree. Single letters stay
// shorthands (-h, -o json); "--" ends the flags.
func goFlagStyle(root *cobra.Command, args []string) []string {
	long := map[string]bool{}
	walk(root, func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) { long[f.Name] = true })
		c.PersistentFlags().VisitAll(func(f *pflag.Flag) { long[f.Name] = true })
	})
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if a == "--" {
			copy(out[i:], args[i:])
			break
		}
		name, _, _ := strings.Cut(a, "=")
		if len(name) > 2 && name[0] == '-' && name[1] != '-' && long[name[1:]] {
			out[i] = "-" + a
		}
	}
	return out
}

// walk calls fn for c and every command under it.
func walk(c *cobra.Command, fn func(*cobra.Command)) {
	fn(c)
	for _, sub := range c.Commands() {
		walk(sub, fn)
	}
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

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
