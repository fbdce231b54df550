package cli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// flagNote is what a flag's definition does not say: the placeholder of
// its value in the usage, and the environment variable or config key that
// has the same meaning elsewhere (markdown: `code` is rendered in the docs
// and dropped from --help). A computed default is the end of the flag's
// usage, "... (default: the cgroup2 mount)", as Go's flag package reads a
// `NAME` placeholder from the usage.
type flagNote struct {
	arg, same string
}

// flagNotes holds the notes by flag name; a name means the same on every
// command that has it. A flag without a note gets its type as placeholder
// and no "same as".
var flagNotes = map[string]flagNote{
	"cni-path":       {arg: "DIRS", same: "`CNI_PATH` of the plugins"},
	"state-dir":      {arg: "DIR"},
	"node-state-dir": {arg: "DIR", same: "`MESHWIRE_NODE_STATE_DIR` of the intercept plugin"},
	"conf":           {arg: "FILE"},
	"ifname":         {arg: "IF", same: "`CNI_IFNAME` of the plugins"},
	"port":           {arg: "[HOSTIP:]HOST:CONTAINER[/PROTO]", same: "the `portMappings` capability"},
	"bandwidth":      {arg: "RATE", same: "the `bandwidth` capability (`ingressRate`, `egressRate`)"},
	"hold":           {arg: "DURATION"},
	"output":         {arg: "FORMAT"},
	"proxy-uid":      {arg: "UID", same: "`iptables-init --proxy-uid`, intercept's `proxy-uid`"},
	"proxy-gid":      {arg: "GID", same: "`iptables-init --proxy-gid`, intercept's `proxy-gid`"},
	"outbound-port":  {arg: "PORT", same: "`iptables-init --envoy-port`, intercept's `envoy-port`"},
	"pin-dir":        {arg: "DIR"},
	"cgroup":         {arg: "DIR"},
	"cni-bin-dir":    {arg: "DIR", same: "containerd's `bin_dir`, CRI-O's `plugin_dirs`"},
	"cni-conf-dir":   {arg: "DIR", same: "containerd's `conf_dir`, CRI-O's `network_dir`"},
	"source-dir":     {arg: "DIR"},
	"plugin-log":     {arg: "FILE", same: "the plugins' `log.file` key (`MESHWIRE_LOG` in their environment)"},
	"proxy-metadata": {arg: "KEY=VALUE", same: "intercept's `proxyMetadata` key"},
	"pod-cidr":       {arg: "CIDR", same: "host-local's `ranges` subnets in the conflist written"},
	"conflist":       {arg: "FILE"},
	"cni-version":    {arg: "VERSION", same: "the conflist's `cniVersion`"},
	"listen":         {arg: "ADDR"},
	"interval":       {arg: "DURATION"},
	"cri-socket":     {arg: "PATH", same: "kubelet's `--container-runtime-endpoint`"},
	"gc-cri-socket":  {arg: "PATH", same: "kubelet's `--container-runtime-endpoint`"},
	"min-age":        {arg: "DURATION"},
	"gc-min-age":     {arg: "DURATION"},
	"gc-interval":    {arg: "DURATION"},
	"cni-cache-dir":  {arg: "DIR"},
}

// flagInfo is a flag as the usage and the docs show it.
type flagInfo struct {
	short, long, arg string
	meaning, def     string
	same             string // markdown, "" for none
}

func describeFlag(f *pflag.Flag) flagInfo {
	note := flagNotes[f.Name]
	placeholder, usage := pflag.UnquoteUsage(f)
	i := flagInfo{short: f.Shorthand, long: f.Name, arg: note.arg, same: note.same}
	i.meaning, i.def = splitDefault(usage)
	switch {
	case f.NoOptDefVal != "": // a bool: no value
		i.arg = ""
	case i.arg == "":
		i.arg = strings.ToUpper(placeholder)
	}
	if i.def == "" {
		switch f.Value.Type() {
		case "stringArray", "stringSlice", "stringToString":
			i.def = "none"
		default:
			i.def = f.DefValue
			if i.def == "" {
				i.def = "none"
			}
		}
	}
	return i
}

// splitDefault splits "meaning (default: X)" into meaning and X.
func splitDefault(usage string) (meaning, def string) {
	i := strings.LastIndex(usage, " (default: ")
	if i < 0 || !strings.HasSuffix(usage, ")") {
		return usage, ""
	}
	return usage[:i], usage[i+len(" (default: ") : len(usage)-1]
}

// names is "-o, --output FORMAT" or "--conf FILE".
func (i flagInfo) names() string {
	s := "--" + i.long
	if i.arg != "" {
		s += " " + i.arg
	}
	if i.short != "" {
		s = "-" + i.short + ", " + s
	}
	return s
}

// plain drops markdown's backquotes.
func plain(md string) string { return strings.ReplaceAll(md, "`", "") }

// flagGroups splits c's flags into its own and the global ones (the root's
// persistent flags), each in the order of definition.
func flagGroups(c *cobra.Command) (own, global []*pflag.Flag) {
	globals := c.Root().PersistentFlags()
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if !f.Hidden && globals.Lookup(f.Name) == nil {
			own = append(own, f)
		}
	})
	globals.VisitAll(func(f *pflag.Flag) {
		if !f.Hidden {
			global = append(global, f)
		}
	})
	return own, global
}

// writeFlags writes one line per flag: names, meaning, default, same as.
// Names longer than maxLeft put the rest on the next line.
func writeFlags(b *strings.Builder, flags []*pflag.Flag) {
	const maxLeft = 36
	infos := make([]flagInfo, len(flags))
	lefts := make([]string, len(flags))
	width := 0
	for k, f := range flags {
		infos[k] = describeFlag(f)
		lefts[k] = infos[k].names()
		if infos[k].short == "" {
			lefts[k] = "    " + lefts[k]
		}
		if n := len(lefts[k]); n > width && n <= maxLeft {
			width = n
		}
	}
	for k, i := range infos {
		right := i.meaning + " (default: " + plain(i.def)
		if i.same != "" {
			right += "; same as " + plain(i.same)
		}
		right += ")"
		if len(lefts[k]) > maxLeft {
			fmt.Fprintf(b, "  %s\n  %-*s  %s\n", lefts[k], width, "", right)
			continue
		}
		fmt.Fprintf(b, "  %-*s  %s\n", width, lefts[k], right)
	}
}

// usage is c's usage: how to call it, its subcommands, its flags and the
// global ones.
func usage(c *cobra.Command) string {
	var b strings.Builder
	own, global := flagGroups(c)
	fmt.Fprintf(&b, "Usage:\n  %s [flags]\n", c.UseLine())
	var subs []*cobra.Command
	for _, s := range c.Commands() {
		if s.IsAvailableCommand() || s.Name() == "help" {
			subs = append(subs, s)
		}
	}
	if len(subs) > 0 {
		b.WriteString("\nCommands:\n")
		width := 0
		for _, s := range subs {
			width = max(width, len(s.Name()))
		}
		for _, s := range subs {
			fmt.Fprintf(&b, "  %-*s  %s\n", width, s.Name(), s.Short)
		}
	}
	b.WriteString("\nFlags:\n")
	writeFlags(&b, own)
	if len(global) > 0 {
		b.WriteString("\nGlobal flags (before or after the command):\n")
		writeFlags(&b, global)
	}
	if len(subs) > 0 {
		fmt.Fprintf(&b, "\nRun '%s help %sCOMMAND' for the usage of a command.\n", c.Root().Name(), strings.TrimPrefix(commandName(c)+" ", c.Root().Name()+" "))
	}
	return b.String()
}

// help is c's description and usage, what -h, --help and `help CMD` print.
func help(c *cobra.Command) string {
	desc := c.Long
	if desc == "" {
		desc = sentence(c.Short) + "."
	}
	return desc + "\n\n" + usage(c)
}

// sentence capitalizes a command's short description.
func sentence(short string) string {
	if short == "" {
		return short
	}
	return strings.ToUpper(short[:1]) + short[1:]
}
