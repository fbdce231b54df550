package cli

import (
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

func runMain(args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	code = Main(args, []byte("{}"), &out, &errb)
	return out.String(), errb.String(), code
}

// commandPaths lists every command but the hidden ones, as argument
// lists: [] for meshwire itself, ["fastpath", "attach"], ...
func commandPaths(t *testing.T) [][]string {
	t.Helper()
	var paths [][]string
	walk(Commands(), func(c *cobra.Command) {
		if c.Hidden {
			return
		}
		paths = append(paths, strings.Fields(strings.TrimPrefix(commandName(c), "meshwire")))
	})
	if len(paths) < 15 {
		t.Fatalf("only %d commands: %v", len(paths), paths)
	}
	return paths
}

// TestHelpEveryCommand: -h, --help, Go's -help and `meshwire help CMD`
// print the command's usage on stdout and exit 0; the usage names every
// flag the command takes, with its default.
func TestHelpEveryCommand(t *testing.T) {
	for _, path := range commandPaths(t) {
		name := strings.Join(append([]string{"meshwire"}, path...), " ")
		c, _, err := Commands().Find(path)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var first string
		for _, args := range [][]string{
			append(slices.Clone(path), "--help"),
			append(slices.Clone(path), "-h"),
			append(slices.Clone(path), "-help"),
			append([]string{"help"}, path...),
		} {
			out, errOut, code := runMain(args...)
			if code != 0 || errOut != "" || !strings.Contains(out, "Usage:\n  "+name+" ") {
				t.Errorf("meshwire %q: exit %d, stderr %q, stdout:\n%s", args, code, errOut, out)
				continue
			}
			if first == "" {
				first = out
			} else if out != first {
				t.Errorf("meshwire %q prints another usage than %q:\n%s", args, path, out)
			}
		}
		c.Flags().VisitAll(func(f *pflag.Flag) {
			i := describeFlag(f)
			if !strings.Contains(first, "--"+f.Name) || !strings.Contains(first, "(default: "+plain(i.def)) {
				t.Errorf("%s --help does not show --%s with its default %q:\n%s", name, f.Name, i.def, first)
			}
			if f.Shorthand != "" && !strings.Contains(first, "-"+f.Shorthand+", --"+f.Name) {
				t.Errorf("%s --help does not show -%s", name, f.Shorthand)
			}
			if i.same != "" && !strings.Contains(first, "same as "+plain(i.same)) {
				t.Errorf("%s --help does not say what --%s is the same as", name, f.Name)
			}
		})
	}
}

// wantUsageError fails t unless meshwire args exited 2 with nothing on
// stdout and, on stderr, one line naming msg, then the usage of the
// command path (as its Use line begins).
func wantUsageError(t *testing.T, args []string, msg, path string) {
	t.Helper()
	out, errOut, code := runMain(args...)
	first, rest, _ := strings.Cut(errOut, "\n")
	if code != 2 || out != "" || !strings.HasPrefix(first, "meshwire: ") || !strings.Contains(first, msg) ||
		!strings.Contains(rest, "Usage:\n  "+path) || !strings.Contains(rest, "\nFlags:\n") {
		t.Errorf("meshwire %q: exit %d, stdout %q, stderr:\n%s\nwant exit 2, %q then the usage of %q", args, code, out, errOut, msg, path)
	}
}

// requiresOperand tells whether c's Use line names something it cannot
// run without: an operand (NAME, COMMAND, attach|detach|status) or a
// required flag (install's --cni-bin-dir DIR), anything not in brackets.
func requiresOperand(c *cobra.Command) bool {
	f := strings.Fields(c.Use)
	return len(f) > 1 && !strings.HasPrefix(f[1], "[")
}

// TestUsageErrors: on every command path, an unknown flag, a flag
// without its value and a missing operand each exit 2 with the command's
// usage on stderr.
func TestUsageErrors(t *testing.T) {
	operands := 0
	for _, path := range commandPaths(t) {
		c, _, err := Commands().Find(path)
		if err != nil {
			t.Fatalf("%q: %v", path, err)
		}
		usagePath := strings.TrimSuffix("meshwire "+strings.Join(path, " "), " ")
		if !c.HasParent() {
			usagePath = "meshwire COMMAND"
		}
		wantUsageError(t, append(slices.Clone(path), "--no-such-flag"), "unknown flag: --no-such-flag", usagePath)
		own, global := flagGroups(c)
		values := 0
		for _, f := range append(own, global...) {
			if f.NoOptDefVal != "" {
				continue // a bool: it takes no value
			}
			values++
			wantUsageError(t, append(slices.Clone(path), "--"+f.Name), "flag needs an argument: --"+f.Name, usagePath)
		}
		if values == 0 {
			t.Errorf("meshwire %q has no flag with a value (the global ones?)", path)
		}
		if requiresOperand(c) {
			operands++
			wantUsageError(t, path, "", usagePath)
		}
	}
	// meshwire COMMAND, add, check, del NAME, fastpath SUB, install,
	// node, completion SHELL.
	if operands != 8 {
		t.Errorf("%d commands require an operand, want 8", operands)
	}
}

// TestUsageErrorMessages: a usage error is one line naming the fault,
// then the command's usage, on stderr; exit 2, nothing on stdout.
func TestUsageErrorMessages(t *testing.T) {
	for _, c := range []struct {
		args      []string
		msg, path string
	}{
		{nil, "no command given", "meshwire COMMAND"},
		{[]string{"frob"}, `unknown command "frob"`, "meshwire COMMAND"},
		{[]string{"fastpth"}, `unknown command "fastpth" (did you mean fastpath?)`, "meshwire COMMAND"},
		{[]string{"add"}, "add: want exactly one namespace NAME, got 0 arguments", "meshwire add NAME"},
		{[]string{"add", "x", "--nope"}, "add: unknown flag: --nope", "meshwire add NAME"},
		{[]string{"add", "x", "--port", "99999:80"}, "host port", "meshwire add NAME"},
		{[]string{"check", "a", "b"}, "check: want exactly one namespace NAME, got 2 arguments", "meshwire check NAME"},
		{[]string{"ls", "x"}, `ls: takes no arguments, got ["x"]`, "meshwire ls"},
		{[]string{"ls", "-o", "yaml"}, `want table or json, got "yaml"`, "meshwire ls"},
		{[]string{"gc", "--conf"}, "gc: flag needs an argument: --conf", "meshwire gc"},
		{[]string{"gc", "--min-age", "5m"}, "gc: --min-age is for a GC against a runtime's pod sandboxes: it needs --cri-socket", "meshwire gc"},
		{[]string{"gc", "--cri-socket", "/nonexistent/cri.sock", "--min-age", "soon"}, `gc: invalid argument "soon" for "--min-age"`, "meshwire gc"},
		{[]string{"gc", "--cri-socket", "/nonexistent/cri.sock", "--min-age", "-1s"}, "gc: --min-age: must not be negative, got -1s", "meshwire gc"},
		{[]string{"gc", "--cri-socket", "/nonexistent/cri.sock"}, "gc: --cri-socket: stat /nonexistent/cri.sock: no such file or directory", "meshwire gc"},
		{[]string{"gc", "--cri-socket", "/dev/null"}, "gc: --cri-socket: /dev/null is not a socket", "meshwire gc"},
		{[]string{"demo", "--hold", "soon"}, "demo: invalid argument", "meshwire demo"},
		{[]string{"fastpath"}, "fastpath: want attach, detach or status", "meshwire fastpath attach|detach|status"},
		{[]string{"fastpath", "--help-me"}, "unknown flag: --help-me", "meshwire fastpath attach|detach|status"},
		{[]string{"fastpath", "frob"}, `fastpath: unknown subcommand "frob"`, "meshwire fastpath attach|detach|status"},
		{[]string{"fastpath", "attach", "--outbound-port", "0"}, "fastpath attach: --outbound-port 0 is not a TCP port", "meshwire fastpath attach"},
		{[]string{"fastpath", "status", "--json", "-o", "table"}, "--json is -o json", "meshwire fastpath status"},
		{[]string{"install"}, "install: --cni-bin-dir and --cni-conf-dir are required", "meshwire install --cni-bin-dir DIR --cni-conf-dir DIR"},
		{[]string{"install", "--cni-bin-dir=/a", "--cni-conf-dir=/b", "--proxy-metadata", "A=1"}, "--proxy-metadata sets the chained", "meshwire install"},
		{[]string{"node", "--cni-bin-dir=/a", "--cni-conf-dir=/b", "--plugin-log=x.log"}, `node: --plugin-log "x.log" is not an absolute path`, "meshwire node"},
		{[]string{"node", "--cni-bin-dir=/a", "--cni-conf-dir=/b", "--proxy-gid", "me"}, `node: --proxy-gid "me" is not a gid`, "meshwire node"},
		{[]string{"node", "--cni-bin-dir=/a", "--cni-conf-dir=/b", "--ambient"}, "node: --ambient needs the intercept plugin in the node's config (--chain or --intercept)", "meshwire node"},
		{[]string{"node", "--cni-bin-dir=/a", "--cni-conf-dir=/b", "--chain", "--ambient", "--ambient-backend", "pf"}, "node: --ambient-backend: ", "meshwire node"},
		{[]string{"completion"}, "completion: want one shell", "meshwire completion"},
		{[]string{"completion", "tcsh"}, `unknown shell "tcsh"`, "meshwire completion"},
		{[]string{"help", "frob"}, `help: unknown command "frob"`, "meshwire help"},
		{[]string{"help", "fastpath", "frob"}, `help: unknown command "fastpath frob"`, "meshwire help"},
		{[]string{"version", "now"}, `version: takes no arguments`, "meshwire version"},
		{[]string{"--cni-path"}, "flag needs an argument: --cni-path", "meshwire COMMAND"},
	} {
		wantUsageError(t, c.args, c.msg, c.path)
	}
}

// TestGCCRISocketUsage: gc --cri-socket names the flag whose value it
// cannot use (the node's network config), before anything runs.
func TestGCCRISocketUsage(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "cri.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	empty := t.TempDir()
	wantUsageError(t, []string{"gc", "--cri-socket", sock, "--cni-conf-dir", empty}, "gc: --cni-conf-dir: no network config (.conflist, .conf, .json) in "+empty, "meshwire gc")
	wantUsageError(t, []string{"gc", "--cri-socket", "unix://" + sock, "--conf", filepath.Join(empty, "none.conflist")}, "gc: --conf: error reading", "meshwire gc")
	wantUsageError(t, []string{"gc", "--cri-socket", sock, "--conf", sock + "x", "--ifname", ""}, "gc: --ifname: must not be empty", "meshwire gc")
}

// TestGlobalFlagsAnywhere: --cni-path and --state-dir are taken before
// the command, after it and among its arguments, in any spelling Go's flag
// package took.
func TestGlobalFlagsAnywhere(t *testing.T) {
	for _, args := range [][]string{
		{"--cni-path", "/p", "--state-dir", "/s", "probe", "NAME"},
		{"probe", "NAME", "--cni-path", "/p", "--state-dir", "/s"},
		{"probe", "--cni-path=/p", "NAME", "--state-dir=/s"},
		{"-cni-path", "/p", "probe", "-state-dir=/s", "NAME"},
		{"--cni-path=/p", "probe", "NAME", "-state-dir", "/s"},
	} {
		e := &env{stateDir: defaultStateDir}
		root := newRoot(e)
		var got []string
		root.AddCommand(&cobra.Command{Use: "probe NAME", Args: oneName, RunE: func(_ *cobra.Command, args []string) error {
			got = args
			return nil
		}})
		var out, errb bytes.Buffer
		if code := execute(root, args, &out, &errb); code != 0 || e.cniPath != "/p" || e.stateDir != "/s" || !slices.Equal(got, []string{"NAME"}) {
			t.Errorf("%q: exit %d (%s), cni path %q, state dir %q, args %q", args, code, errb.String(), e.cniPath, e.stateDir, got)
		}
	}
}

func TestGoFlagStyle(t *testing.T) {
	root := Commands()
	in := []string{"node", "-cni-bin-dir=/a", "-chain", "-listen", "[::1]:9966", "-h", "-o", "json", "-ojson", "-nope", "--conf", "x", "--", "-chain"}
	want := []string{"node", "--cni-bin-dir=/a", "--chain", "--listen", "[::1]:9966", "-h", "-o", "json", "-ojson", "-nope", "--conf", "x", "--", "-chain"}
	if got := goFlagStyle(root, in); !slices.Equal(got, want) {
		t.Errorf("goFlagStyle(%q)\n = %q\nwant %q", in, got, want)
	}
}

// TestCompletion: bash loads the bash script and registers meshwire;
// zsh and fish get theirs.
func TestCompletion(t *testing.T) {
	for shell, want := range map[string]string{"bash": "complete -o default -F __start_meshwire meshwire", "zsh": "#compdef meshwire", "fish": "complete -c meshwire"} {
		out, errOut, code := runMain("completion", shell)
		if code != 0 || errOut != "" || !strings.Contains(out, want) {
			t.Errorf("completion %s: exit %d, stderr %q, script lacks %q", shell, code, errOut, want)
		}
	}
	script, _, _ := runMain("completion", "bash")
	file := filepath.Join(t.TempDir(), "meshwire.bash")
	if err := os.WriteFile(file, []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("bash", "-c", "source "+file+" && complete -p meshwire").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "meshwire") {
		t.Fatalf("bash does not load the completion: %v\n%s", err, out)
	}
}

// TestCompleteFlags: the completion the scripts ask for (the hidden
// __complete command) offers the commands, the flags and -o's formats.
func TestCompleteFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"__complete", ""}, []string{"add", "fastpath", "node", "completion"}},
		{[]string{"__complete", "fastpath", ""}, []string{"attach", "detach", "status"}},
		{[]string{"__complete", "node", "--cni"}, []string{"--cni-bin-dir", "--cni-conf-dir", "--cni-path"}},
		{[]string{"__complete", "ls", "-o", ""}, []string{"table", "json"}},
		{[]string{"__complete", "completion", ""}, []string{"bash", "zsh", "fish"}},
	} {
		out, errOut, code := runMain(c.args...)
		for _, w := range c.want {
			if code != 0 || !strings.Contains(out, w) {
				t.Errorf("%q: exit %d, no %q in\n%s%s", c.args, code, w, out, errOut)
			}
		}
	}
}

// TestFlagNotes: every note is about a flag that exists.
func TestFlagNotes(t *testing.T) {
	seen := map[string]bool{}
	walk(Commands(), func(c *cobra.Command) {
		c.Flags().VisitAll(func(f *pflag.Flag) { seen[f.Name] = true })
		c.PersistentFlags().VisitAll(func(f *pflag.Flag) { seen[f.Name] = true })
	})
	for name := range flagNotes {
		if !seen[name] {
			t.Errorf("flagNotes has --%s, which no command takes", name)
		}
	}
}
