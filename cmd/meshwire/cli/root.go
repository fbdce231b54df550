package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/meshwire/meshwire/internal/buildinfo"
)

func init() {
	// Commands are listed in the order they are added: the pod commands
	// first, as a runtime uses them, then the node's.
	cobra.EnableCommandSorting = false
}

// newRoot builds the command tree; its flags are bound to e.
func newRoot(e *env) *cobra.Command {
	root := &cobra.Command{
		Use:   "meshwire COMMAND",
		Short: "wire network namespaces with CNI conflists as a runtime does; install and run meshwire on a node",
		Long: "meshwire wires named network namespaces with CNI conflists through libcni, the way a\n" +
			"container runtime does (add, check, del, ls, gc), demonstrates the suite (demo),\n" +
			"attaches the eBPF fast path (fastpath) and installs meshwire on a node (install, node).",
		Args: cobra.ArbitraryArgs,
		RunE: func(c *cobra.Command, args []string) error {
			if v, _ := c.Flags().GetBool("version"); v {
				if len(args) > 0 {
					return usagef("--version takes no arguments, got %q", args)
				}
				return printVersion(c)
			}
			if len(args) == 0 {
				return usagef("no command given")
			}
			if s := c.SuggestionsFor(args[0]); len(s) > 0 {
				return usagef("unknown command %q (did you mean %s?)", args[0], strings.Join(s, " or "))
			}
			return usagef("unknown command %q", args[0])
		},
		SuggestionsMinimumDistance: 2,
		SilenceErrors:              true,
		SilenceUsage:               true,
		CompletionOptions:          cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	gf := root.PersistentFlags()
	gf.StringVar(&e.cniPath, "cni-path", "", "colon-separated directories the CNI plugins are run from (default: the meshwire binary's directory, then /opt/cni/bin)")
	gf.StringVar(&e.stateDir, "state-dir", defaultStateDir, "where meshwire keeps its records of the namespaces it wired and libcni's result cache")
	root.Flags().Bool("version", false, "print the meshwire version, as the version command")

	root.AddCommand(
		e.addCmd(), e.checkCmd(), e.delCmd(), e.lsCmd(), e.gcCmd(), e.demoCmd(),
		e.fastpathCmd(), e.installCmd(), e.nodeCmd(),
		completionCmd(), versionCmd(),
	)
	root.SetHelpCommand(helpCmd())
	root.InitDefaultHelpCmd()
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return usagef("%s: %v", commandName(c), err)
	})
	root.SetHelpFunc(func(c *cobra.Command, _ []string) { fmt.Fprint(c.OutOrStdout(), help(c)) })
	root.SetUsageFunc(func(c *cobra.Command) error { _, err := fmt.Fprint(c.OutOrStderr(), usage(c)); return err })
	walk(root, func(c *cobra.Command) {
		c.Flags().SortFlags = false
		c.PersistentFlags().SortFlags = false
		c.Flags().BoolP("help", "h", false, "print this usage and exit")
		c.DisableFlagsInUseLine = true
	})
	return root
}

// commandName is c's path without "meshwire ": "fastpath attach".
func commandName(c *cobra.Command) string {
	if !c.HasParent() {
		return c.Name()
	}
	return strings.TrimPrefix(c.CommandPath(), c.Root().Name()+" ")
}

// oneName accepts exactly one positional argument, the namespace NAME.
func oneName(c *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usagef("%s: want exactly one namespace NAME, got %d arguments", commandName(c), len(args))
	}
	return nil
}

// noArgs refuses positional arguments.
func noArgs(c *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s: takes no arguments, got %q", commandName(c), args)
	}
	return nil
}

func printVersion(c *cobra.Command) error {
	_, err := fmt.Fprintln(c.OutOrStdout(), buildinfo.String("command"))
	return err
}

func versionCmd() *cobra.Command {
	c := leafCmd("version", "print the meshwire version", "")
	c.RunE = func(c *cobra.Command, _ []string) error { return printVersion(c) }
	return c
}

// leafCmd is a command without subcommands or arguments (its flags and
// RunE are the caller's).
func leafCmd(use, short, long string) *cobra.Command {
	return &cobra.Command{Use: use, Short: short, Long: long, Args: noArgs, ValidArgsFunction: cobra.NoFileCompletions}
}

// helpCmd is `meshwire help [COMMAND [SUBCOMMAND]]`: the command's usage
// on stdout; an unknown command is a usage error.
func helpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "help [COMMAND [SUBCOMMAND]]",
		Short: "print the usage of meshwire or of a command",
		ValidArgsFunction: func(c *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			cmd, rest, err := c.Root().Find(args)
			if err != nil || len(rest) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var names []cobra.Completion
			for _, sub := range cmd.Commands() {
				if sub.IsAvailableCommand() && strings.HasPrefix(sub.Name(), toComplete) {
					names = append(names, cobra.CompletionWithDesc(sub.Name(), sub.Short))
				}
			}
			return names, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(c *cobra.Command, args []string) error {
			cmd, rest, err := c.Root().Find(args)
			if err != nil || len(rest) > 0 {
				return usagef("help: unknown command %q", strings.Join(args, " "))
			}
			fmt.Fprint(c.OutOrStdout(), help(cmd))
			return nil
		},
	}
}

// completionCmd is `meshwire completion bash|zsh|fish`.
func completionCmd() *cobra.Command {
	var noDesc bool
	c := &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "print the shell completion script for bash, zsh or fish",
		Long: "Print the shell completion script for bash, zsh or fish on stdout. To load it:\n\n" +
			"  bash:  source <(meshwire completion bash)   (needs the bash-completion package)\n" +
			"  zsh:   source <(meshwire completion zsh)    (after compinit)\n" +
			"  fish:  meshwire completion fish | source",
		ValidArgs: []cobra.Completion{"bash", "zsh", "fish"},
		Args: func(c *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usagef("completion: want one shell, bash, zsh or fish; got %d arguments", len(args))
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			root, out := c.Root(), c.OutOrStdout()
			switch args[0] {
			case "bash":
				return root.GenBashCompletionV2(out, !noDesc)
			case "zsh":
				if noDesc {
					return root.GenZshCompletionNoDesc(out)
				}
				return root.GenZshCompletion(out)
			case "fish":
				return root.GenFishCompletion(out, !noDesc)
			}
			return usagef("completion: unknown shell %q (want bash, zsh or fish)", args[0])
		},
	}
	c.Flags().BoolVar(&noDesc, "no-descriptions", false, "complete without the descriptions of commands and flags")
	return c
}
