package flags

//go:generate go run ../../gendoc ../../../docs/iptables-init.md

import (
	"fmt"
	"strings"

	"github.com/meshwire/meshwire/internal/docgen"
)

// flagDoc is what docs/iptables-init.md says about a flag beyond its
// definition: the meaning (longer than the --help line), and the default
// when the definition's value does not say it (a computed default).
type flagDoc struct {
	def, meaning string
}

// flagDocs holds an entry for every flag of flagDefs, and only those
// (TestFlagDocsComplete); the flag's names, environment variables and
// plain defaults come from flagDefs.
var flagDocs = map[string]flagDoc{
	"envoy-port":           {meaning: "port the proxy listens on for outbound connections"},
	"inbound-capture-port": {meaning: "port the proxy listens on for inbound connections"},
	"inbound-tunnel-port":  {meaning: "inbound port never captured (0: none)"},
	"proxy-uid": {def: "uid of `$ENVOY_USER`", meaning: "uids of the proxy; their connections are not captured. " +
		"Empty (or not given): the uid of the user `ENVOY_USER` names (`istio-proxy` by default) in the container's user database, else 1337, as in Istio"},
	"proxy-gid": {def: "the uids", meaning: "gids of the proxy, same"},
	"istio-inbound-interception-mode": {meaning: "`REDIRECT` (nat; the proxy reads `SO_ORIGINAL_DST`) or `TPROXY` " +
		"(mangle + policy routing; the proxy needs `IP_TRANSPARENT` and sees the client's address)"},
	"ebpf-fallback": {def: "none: fail", meaning: "`REDIRECT` or `TPROXY`: with `-m EBPF`, the rules of that mode " +
		"where the node cannot capture the pod (programs not attached, or attached by a build without a hook it needs). " +
		"Meshwire extension; ignored in the other modes"},
	"istio-inbound-tproxy-mark":          {meaning: "mark of TPROXY-diverted packets"},
	"istio-inbound-tproxy-route-table":   {meaning: "routing table for marked packets (`local default dev lo`)"},
	"istio-inbound-ports":                {meaning: "inbound ports to capture: `*` all, a list, or empty for none"},
	"istio-local-exclude-ports":          {meaning: "inbound ports not captured with `-b '*'`"},
	"istio-service-cidr":                 {meaning: "outbound destinations to capture: `*` all, CIDRs (IPv4 and IPv6 mixed), or empty for none"},
	"istio-service-exclude-cidr":         {meaning: "destinations never captured"},
	"istio-outbound-ports":               {meaning: "outbound ports captured whatever the destination"},
	"istio-local-outbound-ports-exclude": {meaning: "outbound ports never captured, TCP and UDP (so `-o 53` also leaves DNS alone)"},
	"kube-virt-interfaces":               {meaning: "interfaces whose incoming traffic is the pod's outbound traffic (VMs): captured to the outbound port as `-i` says (`-x` applies to the pod's own connections only, as in Istio), never taken for inbound traffic"},
	"istio-exclude-interfaces":           {meaning: "interfaces left alone entirely"},
	"redirect-dns": {meaning: "DNS (UDP and TCP port 53) to the pod's nameservers goes to the proxy's port 15053; " +
		"conntrack zones keep the proxy's own upstream queries apart so they are not looped"},
	"capture-all-dns": {meaning: "with `--redirect-dns`: DNS to any server"},
	"drop-invalid":    {meaning: "drop packets conntrack finds invalid"},
	"dual-stack":      {meaning: "program IPv6 rules when the pod has an IPv6 address; without it, only when the pod's first address (not loopback or link-local) is IPv6, as in Istio"},
	"dry-run":         {meaning: "print exactly what would be applied (restore payloads or nft script, routing) and change nothing"},
	"cleanup-only":    {meaning: "remove every interception rule, chain, policy route and the `::6` address, in every backend, and nothing else"},
	"reconcile":       {meaning: "replace rules installed with other flags (see [How it installs](#how-it-installs))"},
	"force-apply": {meaning: "write the rule set even when it is already in place, and replace other rules as `--reconcile` does " +
		"(Istio's escape hatch from its own idempotency checks). Each table is rewritten in one transaction: nothing is doubled, " +
		"and where `istio-iptables` would append over rules with other flags, meshwire replaces them"},
	"run-validation": {meaning: "after installing, connect from inside the pod to a captured address on the probe port " +
		"and check it reaches the outbound port with the right original destination; exit 126 when it does not"},
	"skip-rule-apply":     {meaning: "with `--run-validation`: validate only"},
	"iptables-probe-port": {meaning: "port the validation connects to"},
	"probe-timeout":       {meaning: "how long the validation waits"},
	"native-nftables": {meaning: "native nftables instead of iptables, in `istio-iptables --native-nftables`' tables " +
		"(`inet istio-proxy-nat`, `istio-proxy-mangle`, `istio-proxy-raw`): the same as `--iptables-backend nftables`"},
	"force-iptables-binary": {def: "detected", meaning: "`legacy` or `nft`: the iptables variant, the same as `--iptables-backend`. " +
		"With `--native-nftables` it is ignored (a warning says so), as in Istio"},
	"iptables-backend": {def: "detected", meaning: "`legacy` or `nft` (iptables variants) or `nftables` " +
		"(native tables, as `--native-nftables`). Meshwire extension; " +
		"asking two of these three flags for different backends is a usage error"},
	"network-namespace": {def: "current", meaning: "namespace file to work in"},
	"cni-mode": {meaning: "with `--network-namespace`, run from the node: the xtables lock is that namespace file " +
		"(`XTABLES_LOCKFILE`), not the node's `/run/xtables.lock`, as `istio-iptables` does in CNI mode " +
		"(only the legacy variant locks). Without `--network-namespace` it has no effect (a warning says so)"},
	"resolv-conf": {meaning: "where `--redirect-dns` reads the nameservers (meshwire extension)"},
	"iptables-trace-logging": {meaning: "accepted, no effect: Istio up to 1.24 put an NFLOG rule (group 1337) before each rule " +
		"for its sidecar to log; 1.25 dropped the rules and 1.26 the reader, so nothing would read them. A warning says so"},
	"restore-format": {meaning: "accepted, no effect: older releases' switch to `iptables-restore`, which meshwire always uses"},
	"log_output_level": {meaning: "Istio's `[scope:]level,...` (levels `debug`, `info`, `warn`, `error`, `fatal`, `none`): " +
		"the level of scope `default` (or `all`) filters iptables-init's messages; other scopes are accepted and ignored, " +
		"as Istio ignores scopes it does not have"},
	"log_as_json": {meaning: "messages as Istio's JSON lines (`{\"level\":\"info\",\"time\":\"...\",\"msg\":\"...\"}`)"},
	"log_target": {def: "stderr", meaning: "where messages go: `stdout`, `stderr` or a file (appended to); repeatable. " +
		"Istio's default is stdout; meshwire keeps stdout for what `--dry-run` prints"},
	"log_caller":           {meaning: "accepted, no effect: meshwire's messages have no caller"},
	"log_stacktrace_level": {meaning: "accepted, no effect (its levels are checked): meshwire's messages have no stack trace"},
	"vklog":                {meaning: "accepted, no effect: pilot-agent's klog verbosity (must be a number); meshwire has no klog output"},
}

// Markers around the generated table in docs/iptables-init.md.
const (
	FlagTableBegin = "<!-- BEGIN flag table: generated from internal/intercept/flags by `go generate ./internal/intercept/flags`; do not edit -->"
	FlagTableEnd   = "<!-- END flag table -->"
)

// MarkdownFlagTable renders every flag of iptables-init as a markdown table:
// names, default, the environment variables that set it, meaning.
func MarkdownFlagTable() string {
	var b strings.Builder
	b.WriteString("| flag | default | environment | meaning |\n|---|---|---|---|\n")
	for _, d := range flagDefs {
		doc := flagDocs[d.long]
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", docNames(d), docDefault(d, doc), docEnv(d), doc.meaning)
	}
	return b.String()
}

func docNames(d flagDef) string {
	if d.short == "" {
		return "`--" + d.long + "`"
	}
	return "`-" + d.short + "`, `--" + d.long + "`"
}

func docDefault(d flagDef, doc flagDoc) string {
	switch {
	case doc.def != "":
		return doc.def
	case d.isBool:
		return "off"
	case d.def == "":
		return "empty"
	}
	return "`" + d.def + "`"
}

// docEnv lists the variables that set the flag, as applyEnv reads them.
func docEnv(d flagDef) string {
	if d.noEnv {
		return "none"
	}
	s := "`" + EnvName(d.long) + "`"
	for _, a := range d.envAliases {
		s += ", `" + a + "` (wins)"
	}
	for _, f := range d.envFallbacks {
		s += ", `" + f + "` (when nothing else sets it)"
	}
	return s
}

// SpliceFlagTable returns doc with the text between FlagTableBegin and
// FlagTableEnd replaced by MarkdownFlagTable.
func SpliceFlagTable(doc []byte) ([]byte, error) {
	return docgen.Splice(doc, FlagTableBegin, FlagTableEnd, MarkdownFlagTable())
}
