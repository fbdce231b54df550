package framework

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/meshwire/meshwire/test/istio"
)

// podNetnsScript prints the network namespace of the runtime's sandboxes
// (/run/netns/cni-*, as containerd names them) whose eth0 holds the
// address $1: the pod's, found on its node whatever network wired it (no
// plugin's record is read).
const podNetnsScript = `ip=$1; found=
for n in /run/netns/cni-*; do
	[ -e "$n" ] || continue
	if nsenter --net="$n" ip -o addr show dev eth0 2>/dev/null | grep -qF " $ip/"; then found="$found $n"; fi
done
set -- $found
[ $# = 1 ] || { echo "$# network namespaces hold $ip:$found" >&2; exit 1; }
echo "$1"`

// rulesScript prints the firewall rules of the network namespace $1, one
// section per tool: both iptables variants of both families (each sees
// only its own tables), then the nftables tables that are no iptables
// variant's (a native nftables backend's); then its policy routing
// (TPROXY's mark rule and the table it looks up): the rules, and the
// routes of the tables other than main and local (those hold the pod's
// own addresses, which differ from pod to pod).
const rulesScript = `n=$1
for t in iptables-legacy-save iptables-nft-save ip6tables-legacy-save ip6tables-nft-save; do
	echo "### $t"
	nsenter --net="$n" "$t" 2>&1 || echo "($t failed: $?)"
done
echo "### nft (tables of no iptables variant)"
nsenter --net="$n" nft list tables 2>&1 | while read -r _ fam name; do
	case "$fam $name" in "ip "* | "ip6 "*)
		case $name in filter | nat | mangle | raw | security) continue ;; esac ;;
	esac
	nsenter --net="$n" nft list table "$fam" "$name" 2>&1
done
echo "### ip rule"
nsenter --net="$n" ip -4 rule 2>&1
nsenter --net="$n" ip -6 rule 2>&1
echo "### ip route (tables other than main and local)"
for f in -4 -6; do
	nsenter --net="$n" ip "$f" route show table all 2>&1 | grep ' table ' | grep -Ev ' table (main|local)( |$)' || :
done`

// PodRules reads the firewall rules in pod's network namespace from its
// node (iptables-save of both variants and families, nft for the other
// tables, the policy routing), normalized (NormalizeRules).
func (c *Cluster) PodRules(ctx context.Context, pod *corev1.Pod) (string, error) {
	if pod.Status.PodIP == "" || pod.Spec.NodeName == "" {
		return "", fmt.Errorf("pod %s/%s has no address or node yet", pod.Namespace, pod.Name)
	}
	n, err := c.Node(pod.Spec.NodeName)
	if err != nil {
		return "", err
	}
	return n.RulesAt(pod.Status.PodIP)
}

// RulesAt reads, as PodRules does, the rules of the sandbox on node n
// whose eth0 holds ip: without the API server.
func (n Node) RulesAt(ip string) (string, error) {
	out, err := n.Command("sh", "-c", podNetnsScript, "sh", ip).Output()
	if err != nil {
		return "", fmt.Errorf("the network namespace of %s on %s: %w%s", ip, n.Name, err, stderr(err))
	}
	netns := strings.TrimSpace(string(out))
	out, err = n.Command("sh", "-c", rulesScript, "sh", netns).Output()
	if err != nil {
		return "", fmt.Errorf("the rules of %s (%s on %s): %w%s", ip, netns, n.Name, err, stderr(err))
	}
	return NormalizeRules(string(out)), nil
}

var (
	chainCounters = regexp.MustCompile(`^(:\S+ \S+) \[\d+:\d+\]$`)
	ruleCounters  = regexp.MustCompile(`^\[\d+:\d+\] `)
	nftCounters   = regexp.MustCompile(`counter packets \d+ bytes \d+`)
	nftHandles    = regexp.MustCompile(` # handle \d+$`)
)

// NormalizeRules makes two readings of rules comparable: what differs
// between two namespaces, two runs or two hosts with the same rules is
// left out. iptables-save's sections are read as Istio's goldens are
// compared (istio.NormalizeSave: no comment lines, no counters, no rule
// comments, such as the ownership tag meshwire puts on its jumps, and no
// table holding nothing, which a reader such as Istio's backend probe
// merely instantiated); elsewhere comments go (warnings), counters are
// zeroed and nft's handles dropped; trailing blanks are trimmed, and a
// tool's section with nothing in it is left out.
func NormalizeRules(s string) string {
	var out []string
	var header string
	var body []string
	flush := func() {
		var lines []string
		if strings.HasSuffix(header, "tables-legacy-save") || strings.HasSuffix(header, "tables-nft-save") {
			if n := istio.NormalizeSave(strings.Join(body, "\n")); n != "" {
				lines = strings.Split(n, "\n")
			}
		} else {
			for _, l := range body {
				switch {
				case l == "", strings.HasPrefix(l, "#"), strings.HasPrefix(strings.TrimSpace(l), "# Warning"):
					continue
				}
				l = chainCounters.ReplaceAllString(l, "$1 [0:0]")
				l = ruleCounters.ReplaceAllString(l, "")
				l = nftCounters.ReplaceAllString(l, "counter packets 0 bytes 0")
				lines = append(lines, nftHandles.ReplaceAllString(l, ""))
			}
		}
		if len(lines) > 0 {
			if header == "" {
				header = "### (no tool)"
			}
			out = append(append(out, header), lines...)
		}
		header, body = "", nil
	}
	for _, l := range strings.Split(s, "\n") {
		l = strings.TrimRight(l, " \t\r")
		if strings.HasPrefix(l, "### ") {
			flush()
			header = l
			continue
		}
		body = append(body, l)
	}
	flush()
	if len(out) == 0 {
		return ""
	}
	return strings.Join(out, "\n") + "\n"
}

// FoldVariants takes from normalized rules (NormalizeRules) which iptables
// variant holds them: the sections of iptables-legacy-save and
// iptables-nft-save (ip6tables' too) are renamed iptables-save
// (ip6tables-save), and variants lists, in order, the sections that held
// rules ("iptables-nft-save", ...). Two agents that wrote the same rules
// with different variants (each detects the host's, as Istio's
// DetectIptablesVersion does) then compare equal, and the variant is
// reported on its own.
func FoldVariants(rules string) (folded string, variants []string) {
	lines := strings.Split(rules, "\n")
	for i, l := range lines {
		tool, ok := strings.CutPrefix(l, "### ")
		if !ok {
			continue
		}
		for _, v := range []string{"-legacy-save", "-nft-save"} {
			if base, ok := strings.CutSuffix(tool, v); ok && strings.HasSuffix(base, "tables") {
				variants = append(variants, tool)
				lines[i] = "### " + base + "-save"
			}
		}
	}
	return strings.Join(lines, "\n"), variants
}

// the other has not.
func DiffRules(aName, a, bName, b string) error {
	if a == b {
		return nil
	}
	al, bl := strings.Split(strings.TrimSuffix(a, "\n"), "\n"), strings.Split(strings.TrimSuffix(b, "\n"), "\n")
	i := 0
	for i < len(al) && i < len(bl) && al[i] == bl[i] {
		i++
	}
	at := func(l []string) string {
		if i < len(l) {
			return l[i]
		}
		return "(end)"
	}
	var w strings.Builder
	fmt.Fprintf(&w, "%d lines and %d lines; line %d: %s has %q, %s has %q", len(al), len(bl), i+1, aName, at(al), bName, at(bl))
	for _, d := range []struct {
		name     string
		own, oth []string
	}{{aName, al, bl}, {bName, bl, al}} {
		only := missing(d.own, d.oth)
		if len(only) > 0 {
			fmt.Fprintf(&w, "\nonly in %s:\n  %s", d.name, strings.Join(only, "\n  "))
		}
	}
	return fmt.Errorf("%s", w.String())
}

// missing is the lines of a that b lacks, counted as multisets.
func missing(a, b []string) []string {
	have := map[string]int{}
	for _, l := range b {
		have[l]++
	}
	var out []string
	for _, l := range a {
		if have[l] > 0 {
			have[l]--
			continue
		}
		out = append(out, l)
	}
	return out
}

// stderr is ": " and what a failed command wrote to stderr, if anything.
func stderr(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) && len(ee.Stderr) > 0 {
		return ": " + strings.TrimSpace(string(ee.Stderr))
	}
	return ""
}
