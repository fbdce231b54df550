// Command snapshot is the e2e suite's leak snapshot (test/harness) as a
// command, for what a Go test cannot wrap: the single-node cluster's
// scripts (test/cluster) take it before meshwire is installed and compare
// after everything was deleted. Not shipped.
//
//	snapshot save FILE [-wait D]            # the host's state, as JSON
//	snapshot check FILE [-allow RE] [-bridge NAME] [-netns RE] [-wait D]  # compare: exit 1 and list the differences
//
// save retakes the snapshot until two in a row agree, a second apart, or
// -wait runs out (a kube-proxy still writing its rules); check retakes it
// until it matches FILE or -wait runs out (what a runtime or kube-proxy
// removes settles asynchronously); lines matching -allow are not
// differences, nor are those -bridge names: what a bridge plugin keeps on
// the node by design once every pod is gone (bridge.go); with -netns, only
// the named network namespaces whose names match are judged: the others
// are other tools' (a machine's other users come and go meanwhile).
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"regexp"
	"time"

	"github.com/meshwire/meshwire/test/harness"
)

func main() {
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: snapshot save FILE | snapshot check FILE [-allow RE] [-wait DURATION]")
		os.Exit(2)
	}
	cmd, file := os.Args[1], os.Args[2]
	fs := flag.NewFlagSet("snapshot "+cmd, flag.ExitOnError)
	allow := fs.String("allow", "", "differences matching this regular expression are expected")
	bridge := fs.String("bridge", "", "the bridge a bridge plugin keeps: its link, addresses, their routes, its sysctls and forwarding turned on are expected")
	ownNetns := fs.String("netns", "", "judge only the named network namespaces whose names match this regular expression")
	wait := fs.Duration("wait", 30*time.Second, "how long check retakes the snapshot until it matches")
	_ = fs.Parse(os.Args[3:])
	var err error
	switch cmd {
	case "save":
		err = save(file, *wait)
	case "check":
		var allowed []func(string) bool
		if *allow != "" {
			var re *regexp.Regexp
			if re, err = regexp.Compile(*allow); err != nil {
				break
			}
			allowed = append(allowed, re.MatchString)
		}
		if *ownNetns != "" {
			var re *regexp.Regexp
			if re, err = regexp.Compile(*ownNetns); err != nil {
				break
			}
			allowed = append(allowed, othersNetns(re))
		}
		if *bridge != "" {
			var b func(string) bool
			if b, err = bridgeAllowance(*bridge); err != nil {
				break
			}
			allowed = append(allowed, b)
		}
		var diff []string
		if diff, err = check(file, allowed, *wait); err == nil && len(diff) > 0 {
			fmt.Printf("the host differs from %s:\n", file)
			for _, d := range diff {
				fmt.Println("  " + d)
			}
			os.Exit(1)
		}
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "snapshot:", err)
		os.Exit(2)
	}
}

func save(file string, wait time.Duration) error {
	s, err := harness.TakeSnapshot()
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(wait); time.Now().Before(deadline); {
		time.Sleep(time.Second)
		next, err := harness.TakeSnapshot()
		if err != nil {
			return err
		}
		if len(s.Diff(next)) == 0 {
			break
		}
		s = next
	}
	b, err := json.Marshal(s)
	if err != nil {
		return err
	}
	return os.WriteFile(file, b, 0o600)
}

func check(file string, allowed []func(string) bool, wait time.Duration) ([]string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var before harness.Snapshot
	if err := json.Unmarshal(b, &before); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	for deadline := time.Now().Add(wait); ; time.Sleep(time.Second) {
		after, err := harness.TakeSnapshot()
		if err != nil {
			return nil, err
		}
		var diff []string
	next:
		for _, d := range before.Diff(after) {
			for _, ok := range allowed {
				if ok(d) {
					continue next
				}
			}
			diff = append(diff, d)
		}
		if len(diff) == 0 || time.Now().After(deadline) {
			return diff, nil
		}
	}
}

var netnsLine = regexp.MustCompile(`^netns: (added|removed) "(.*)"$`)

// othersNetns allows the differences of named network namespaces whose
// names own does not match.
func othersNetns(own *regexp.Regexp) func(string) bool {
	return func(d string) bool {
		m := netnsLine.FindStringSubmatch(d)
		return m != nil && !own.MatchString(m[2])
	}
}
