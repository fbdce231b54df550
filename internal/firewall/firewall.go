// Package firewall is the one front door to the host's firewall: it
// resolves the backend (configured, else the node's cached detection),
// applies typed transactions (ruleset.Tx) one atomic transaction at a time
// and reads back typed tables (package installed), through Interface.
// Host, the real one, writes over netlink what needs no tool
// (fwnetlink), else renders the transaction (fwtext) for
// `iptables-restore --noflush` of one address family or `nft -f -`; it
// reads nf_tables over netlink and legacy iptables through its tools'
// text and one getsockopt. Rule generation lives with each feature; the
// in-memory fake that applies the same transactions is fwfake.
package firewall

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/nftnl"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// Kind is the firewall API in use.
type Kind string

const (
	IPTables Kind = "iptables"
	NFTables Kind = "nftables"
)

// Variant is the iptables implementation: the legacy xtables kernel API or
// the nf_tables-backed iptables-nft. Empty means whatever `iptables` is.
type Variant string

const (
	VariantDefault Variant = ""
	VariantLegacy  Variant = "legacy"
	VariantNFT     Variant = "nft"
)

// Backend is a detected or configured firewall backend.
type Backend struct {
	Kind    Kind
	Variant Variant // iptables only
}

func (b Backend) String() string {
	if b.Kind == IPTables && b.Variant != VariantDefault {
		return "iptables-" + string(b.Variant)
	}
	return string(b.Kind)
}

// Parse reads a backend name as users write it in configs and flags:
// iptables, nftables, legacy, nft, iptables-legacy, iptables-nft.
func Parse(s string) (Backend, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "iptables":
		return Backend{Kind: IPTables}, nil
	case "legacy", "iptables-legacy":
		return Backend{Kind: IPTables, Variant: VariantLegacy}, nil
	case "nft", "iptables-nft":
		return Backend{Kind: IPTables, Variant: VariantNFT}, nil
	case "nftables":
		return Backend{Kind: NFTables}, nil
	}
	return Backend{}, fmt.Errorf("unknown firewall backend %q (want iptables, nftables, legacy or nft)", s)
}

// tool returns the binary name for an iptables tool ("restore", "save").
func (b Backend) tool(f ruleset.IPVersion, what string) string {
	base := "iptables"
	if f == ruleset.V6 {
		base = "ip6tables"
	}
	if b.Variant != VariantDefault {
		base += "-" + string(b.Variant)
	}
	return base + "-" + what
}

// lockWait bounds how long iptables-restore waits for the xtables lock.
const lockWait = 10 * time.Second

// Restore applies an iptables-restore payload with --noflush: the tables it
// names are changed in one transaction and nothing else is touched. A busy
// xtables lock ends in CNI code 11.
func (b Backend) Restore(ctx context.Context, f ruleset.IPVersion, payload string) error {
	if b.Kind != IPTables {
		return fmt.Errorf("Restore needs an iptables backend, have %s", b)
	}
	args := []string{"--noflush", "-w", fmt.Sprint(int(lockWait.Seconds()))}
	_, err := run(ctx, b.tool(f, "restore"), payload, args...)
	return err
}

// Save returns iptables-save output for one table (all tables when table is "").
func (b Backend) Save(ctx context.Context, f ruleset.IPVersion, table string) (string, error) {
	if b.Kind != IPTables {
		return "", fmt.Errorf("Save needs an iptables backend, have %s", b)
	}
	var args []string
	if table != "" {
		args = append(args, "-t", table)
	}
	return run(ctx, b.tool(f, "save"), "", args...)
}

// ListChain returns `iptables -S CHAIN` for one chain of a table: a "-N"
// line (for user chains) and the chain's rules as iptables-save writes them.
// It reads one chain, which is much cheaper than Save on a busy node. A
// missing chain is an error.
func (b Backend) ListChain(ctx context.Context, f ruleset.IPVersion, table, chain string) (string, error) {
	if b.Kind != IPTables {
		return "", fmt.Errorf("ListChain needs an iptables backend, have %s", b)
	}
	name := strings.TrimSuffix(b.tool(f, "x"), "-x")
	return run(ctx, name, "", "-w", fmt.Sprint(int(lockWait.Seconds())), "-t", table, "-S", chain)
}

// NftApply runs an nft script as one transaction.
func NftApply(ctx context.Context, script string) error {
	_, err := run(ctx, "nft", script, "-f", "-")
	return err
}

// Nft runs an nft command (e.g. "list", "table", "inet", "meshwire") and
// returns its output.
func Nft(ctx context.Context, args ...string) (string, error) {
	return run(ctx, "nft", "", args...)
}

// Available checks that the backend's tools exist and can read the ruleset:
// the STATUS check of plugins that program the firewall.
func (b Backend) Available(ctx context.Context) error {
	var err error
	switch b.Kind {
	case IPTables:
		_, err = b.Save(ctx, ruleset.V4, "nat")
	case NFTables:
		_, err = Nft(ctx, "list", "tables")
	default:
		err = fmt.Errorf("no backend")
	}
	if err != nil {
		return cnierr.NotAvailable("firewall backend %s is not usable: %v", b, err)
	}
	return nil
}

// NetlinkAvailable checks that nf_tables answers over netlink: the STATUS
// check of what meshwire writes to native nftables with no tool (ipMasq).
func NetlinkAvailable() error {
	if !nftablesReachable() {
		return cnierr.NotAvailable("nf_tables does not answer over netlink (no nf_tables in the kernel, or no CAP_NET_ADMIN)")
	}
	return nil
}

func run(ctx context.Context, name, stdin string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	// A runtime kills a plugin (its timeout, an OOM kill) but not the tool
	// it runs: the tool dies with it, so that no restore commits after the
	// DEL that follows the kill.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		if errors.Is(err, exec.ErrNotFound) {
			return "", missingTool(name)
		}
		msg := strings.TrimSpace(errb.String())
		if lockBusy(name, err, msg) {
			return "", cnierr.TryAgain("%s: the xtables lock is busy: %s", name, msg)
		}
		if msg == "" {
			msg = err.Error()
		}
		return "", fmt.Errorf("%s %s: %s", name, strings.Join(args, " "), msg)
	}
	return out.String(), nil
}

// resourceProblem is the exit status of the iptables tools that could
// not get what they needed, the xtables lock above all (xtables.h's
// RESOURCE_PROBLEM; measured with iptables 1.8.9: a restore that waited
// -w for a held lock exits with it).
const resourceProblem = 4

// lockBusy tells whether err, with the tool's stderr, is an iptables
// tool's exit for a busy xtables lock: its exit status and its message
// ("Another app is currently holding the xtables lock. Stopped waiting
// after 1s.", iptables-legacy-restore 1.8.9). The status alone is not
// enough: iptables-nft-restore exits with it too when its commit fails,
// for one when a chain it appends to went in a concurrent transaction
// ("RULE_APPEND failed (No such file or directory)"), which is no lock
// and must not be answered with "try again" (nft has no such lock).
func lockBusy(name string, err error, stderr string) bool {
	var ee *exec.ExitError
	return strings.Contains(name, "tables") && errors.As(err, &ee) && ee.ExitCode() == resourceProblem &&
		strings.Contains(stderr, "xtables lock")
}

// missingTool is the error of a firewall tool that is not installed: code
// 50 (the plugin cannot serve ADD on this node until someone installs it),
// naming the package that has it.
func missingTool(name string) error {
	pkg := "iptables"
	if name == "nft" {
		pkg = "nftables"
	}
	return cnierr.NotAvailable("%s is not installed on this node: install the %q package (Debian and Ubuntu: apt-get install %s), or configure another firewall backend", name, pkg, pkg)
}

// Usable reports whether meshwire can program b on this node as it is:
// its tools are on PATH, or b is native nftables, which meshwire drives
// over netlink where it can (ipMasq) and whose other users name the
// nftables package when nft is missing. A detection that is not usable is
// not worth remembering (installing a tool changes it); a usable one is
// remembered even without tools, so that a DEL uses what its ADD used.
func (b Backend) Usable() bool { return b.Kind == NFTables || b.ToolsInstalled() }

// ToolsInstalled reports whether the tools b runs are on PATH.
func (b Backend) ToolsInstalled() bool {
	name := "nft"
	if b.Kind == IPTables {
		name = b.tool(ruleset.V4, "restore")
	}
	_, err := exec.LookPath(name)
	return err == nil
}

// Detect picks the backend the host (the current network namespace) already
// uses, so meshwire's rules land where the rest of the node's rules are:
// iptables-legacy if legacy tables hold rules, else iptables-nft if its
// tables hold rules, else nftables if native nftables tables exist, else
// iptables through the distribution's default `iptables`; with no iptables
// installed, nftables when nft is installed or, with no tool at all,
// when nf_tables answers over netlink. A tool's
// backend counts only when its tools are installed. What lives in
// nf_tables is looked up over netlink (the tools only when that fails),
// and a legacy family whose namespace never loaded a table is not read:
// in a fresh pod namespace, detection runs no tool at all.
func Detect(ctx context.Context) Backend {
	legacy := Backend{Kind: IPTables, Variant: VariantLegacy}
	if hasRules(ctx, legacy) {
		return legacy
	}
	nft := Backend{Kind: IPTables, Variant: VariantNFT}
	rules, native, err := lookInNFTables(nft)
	if err != nil {
		rules = hasRules(ctx, nft)
		out, err := Nft(ctx, "list", "tables")
		native = err == nil && hasNativeTables(out)
	}
	if rules {
		return nft
	}
	if native {
		return Backend{Kind: NFTables}
	}
	if _, err := exec.LookPath("iptables-restore"); err != nil {
		// No iptables: native nftables, with nft, or with no tool at all
		// when nf_tables answers over netlink (meshwire writes ipMasq's
		// tables over netlink; what needs nft says to install it).
		if _, err := exec.LookPath("nft"); err == nil || nftablesReachable() {
			return Backend{Kind: NFTables}
		}
	}
	return Backend{Kind: IPTables}
}

// nftablesReachable tells whether nf_tables answers over netlink here (a
// table list); tests replace it.
var nftablesReachable = func() bool {
	c, err := nftnl.Open()
	if err != nil {
		return false
	}
	defer c.Close()
	_, err = c.Tables(ruleset.Inet)
	return err == nil
}

func hasRules(ctx context.Context, b Backend) bool {
	for _, f := range []ruleset.IPVersion{ruleset.V4, ruleset.V6} {
		if _, err := exec.LookPath(b.tool(f, "save")); err != nil {
			continue
		}
		if b.Variant == VariantLegacy && !fwtext.LegacyTablesLoaded(f.Tables()) {
			continue // iptables-save would list no table
		}
		out, err := b.Save(ctx, f, "")
		if err == nil && CountRules(out) > 0 {
			return true
		}
	}
	return false
}

// lookInNFTables tells, over netlink, what iptables-nft-save and `nft list
// tables` would: whether the iptables tables of b (iptables-nft) hold rules,
// for the families whose iptables-nft-save is installed, and whether there
// are native tables (when nft is installed).
func lookInNFTables(b Backend) (rules, native bool, err error) {
	c, err := nftnl.Open()
	if err != nil {
		return false, false, err
	}
	defer c.Close()
	_, nftErr := exec.LookPath("nft")
	for _, fam := range []ruleset.Family{ruleset.IP, ruleset.IP6, ruleset.Inet, ruleset.ARP, ruleset.Bridge, ruleset.Netdev} {
		names, err := c.Tables(fam)
		if err != nil {
			return false, false, err
		}
		_, toolErr := exec.LookPath(b.tool(ruleset.V4, "save"))
		if fam == ruleset.IP6 {
			_, toolErr = exec.LookPath(b.tool(ruleset.V6, "save"))
		}
		for _, n := range names {
			if (fam != ruleset.IP && fam != ruleset.IP6) || !iptablesNFTTables[n] {
				native = native || nftErr == nil
				continue
			}
			if rules || toolErr != nil {
				continue
			}
			count := 0
			err := c.Dump(unix.NFT_MSG_GETRULE, fam, []nftnl.Attr{nftnl.StrAttr(unix.NFTA_RULE_TABLE, n)},
				func() { count = 0 }, func([]byte) { count++ })
			if err != nil {
				return false, false, err
			}
			rules = count > 0
		}
	}
	return rules, native, nil
}

// CountRules counts the rules ("-A" lines) in iptables-save output.
func CountRules(save string) int {
	n := 0
	for _, line := range strings.Split(save, "\n") {
		if strings.HasPrefix(line, "-A ") {
			n++
		}
	}
	return n
}

// iptablesNFTTables are the tables iptables-nft creates in nf_tables; any
// other table is native nftables.
var iptablesNFTTables = map[string]bool{"filter": true, "nat": true, "mangle": true, "raw": true, "security": true}

func hasNativeTables(listTables string) bool {
	for _, line := range strings.Split(listTables, "\n") {
		f := strings.Fields(line) // "table ip nat"
		if len(f) != 3 || f[0] != "table" {
			continue
		}
		if (f[1] == "ip" || f[1] == "ip6") && iptablesNFTTables[f[2]] {
			continue
		}
		return true
	}
	return false
}
