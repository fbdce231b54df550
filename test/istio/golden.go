package istio

import (
	"regexp"
	"slices"
	"strings"
)

// SplitIPTablesGolden splits an istio-iptables golden (the commands run:
// iptables-save, then the IPv4 restore input, then the IPv6 one, each a
// series of "* table" ... COMMIT blocks in table order) into the two
// restore payloads, in iptables-restore's own syntax.
func SplitIPTablesGolden(golden string) (v4, v6 string) {
	var fam [2]strings.Builder
	cur, last := 0, ""
	for _, line := range strings.Split(golden, "\n") {
		switch {
		case line == "iptables-save" || line == "ip6tables-save" || line == "":
			continue
		case strings.HasPrefix(line, "* "):
			table := strings.TrimPrefix(line, "* ")
			if last != "" && table <= last {
				cur = 1
			}
			last = table
			line = "*" + table
		}
		fam[cur].WriteString(line + "\n")
	}
	return fam[0].String(), fam[1].String()
}

var (
	counters = regexp.MustCompile(` \[\d+:\d+\]$`)
	comment  = regexp.MustCompile(` -m comment --comment ("[^"]*"|\S+)`)
)

// NormalizeSave keeps what iptables-save prints of the rules: no comment
// lines, counters or rule comments, no table holding nothing (a table a
// reader merely instantiated), tables in name order (legacy iptables lists
// them in the order they were loaded).
func NormalizeSave(save string) string {
	var out [][]string
	var table []string
	rules := false
	for _, line := range strings.Split(save, "\n") {
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
			continue
		case strings.HasPrefix(line, "*"):
			table, rules = []string{line}, false
			continue
		case line == "COMMIT":
			if rules {
				out = append(out, append(table, line))
			}
			table = nil
			continue
		case strings.HasPrefix(line, ":"):
			line = counters.ReplaceAllString(line, "")
			if f := strings.Fields(line); len(f) > 1 && f[1] == "-" {
				rules = true // a user chain
			}
		default:
			line = comment.ReplaceAllString(line, "")
			rules = true
		}
		table = append(table, line)
	}
	slices.SortFunc(out, func(a, b []string) int { return strings.Compare(a[0], b[0]) })
	var lines []string
	for _, t := range out {
		lines = append(lines, t...)
	}
	return strings.Join(lines, "\n")
}

// olderCNIForm turns the rules of an older istio-iptables, as
// istio-cni's status-ports.txt.golden holds them, into today's: the
// OUTPUT jump for every protocol, the status port's UDP exclusion, and
// the tunnel port (15008) left out of the loopback redirections.
// TestStatusPortsGolden proves these are the only differences.
var olderCNIForm = strings.NewReplacer(
	"-A OUTPUT -p tcp -j ISTIO_OUTPUT\n", "-A OUTPUT -j ISTIO_OUTPUT\n",
	"-A ISTIO_OUTPUT -p tcp --dport 15020 -j RETURN\n-A ISTIO_OUTPUT -o lo -s",
	"-A ISTIO_OUTPUT -p tcp --dport 15020 -j RETURN\n-A ISTIO_OUTPUT -p udp --dport 15020 -j RETURN\n-A ISTIO_OUTPUT -o lo -s",
	"-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -m owner ", "-A ISTIO_OUTPUT -o lo ! -d 127.0.0.1/32 -p tcp ! --dport 15008 -m owner ",
)

// CurrentCNIGolden is an istio-cni golden in an older istio-iptables'
// form (status-ports.txt.golden) in today's.
func CurrentCNIGolden(golden string) string { return olderCNIForm.Replace(golden) }
