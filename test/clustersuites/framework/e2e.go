package framework

import (
	"context"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// E2EResult is one run of Kubernetes' e2e suite (e2e.test), read from the
// JUnit report Ginkgo writes: every spec the focus selected, by state.
type E2EResult struct {
	// Specs maps each spec's full name to passed, failed or skipped.
	Specs map[string]string
	// Summary is Ginkgo's own summary lines from the log ("Ran N of M
	// Specs", SUCCESS!/FAIL!, the [FAIL] lines).
	Summary []string
	Log     string
}

// Count is how many specs are in state (passed, failed, skipped).
func (r E2EResult) Count(state string) int {
	n := 0
	for _, s := range r.Specs {
		if s == state {
			n++
		}
	}
	return n
}

// Ran is how many specs ran (passed or failed).
func (r E2EResult) Ran() int { return r.Count("passed") + r.Count("failed") }

// With lists the specs in state, sorted.
func (r E2EResult) With(state string) []string {
	var out []string
	for name, s := range r.Specs {
		if s == state {
			out = append(out, name)
		}
	}
	sort.Strings(out)
	return out
}

// RunE2E runs e2e.test (the cluster's build of Kubernetes' e2e suite, made
// by build.sh e2e when missing) against the cluster with a Ginkgo focus and
// skip, its report and log in dir. A suite whose specs fail is a result,
// not an error; an error is a run that could not be read.
func (c *Cluster) RunE2E(ctx context.Context, focus, skip, dir string) (E2EResult, error) {
	bin := filepath.Join(c.Bin, "e2e.test")
	if _, err := os.Stat(bin); err != nil {
		b := exec.CommandContext(ctx, filepath.Join(c.Repo, "test", "cluster", "build.sh"), "e2e")
		if out, err := b.CombinedOutput(); err != nil {
			return E2EResult{}, fmt.Errorf("build.sh e2e: %v\n%s", err, out)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return E2EResult{}, err
	}
	logPath := filepath.Join(dir, "e2e.log")
	logf, err := os.Create(logPath)
	if err != nil {
		return E2EResult{}, err
	}
	defer logf.Close()
	cmd := exec.CommandContext(ctx, bin, "--kubeconfig", c.Kubeconfig, "--provider", "local",
		"--kubectl-path", filepath.Join(c.Bin, "kubectl"), "--dump-logs-on-failure=false", "--report-dir", dir,
		"--ginkgo.focus", focus, "--ginkgo.skip", skip, "--ginkgo.no-color")
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, logf, logf
	runErr := cmd.Run()
	res, err := ReadE2E(dir)
	if err != nil {
		return res, fmt.Errorf("e2e.test (%v): %w", runErr, err)
	}
	return res, nil
}

var summaryLine = regexp.MustCompile(`^ *\[FAIL\]|^Ran [0-9]|^(SUCCESS|FAIL)!`)

// ReadE2E reads a run's JUnit report and log in dir.
func ReadE2E(dir string) (E2EResult, error) {
	res := E2EResult{Specs: map[string]string{}, Log: filepath.Join(dir, "e2e.log")}
	if b, err := os.ReadFile(res.Log); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if summaryLine.MatchString(l) {
				res.Summary = append(res.Summary, strings.TrimSpace(l))
			}
		}
	}
	b, err := os.ReadFile(filepath.Join(dir, "junit_01.xml"))
	if err != nil {
		return res, fmt.Errorf("no JUnit report: %w", err)
	}
	var suites struct {
		Suites []struct {
			Cases []struct {
				Name    string    `xml:"name,attr"`
				Status  string    `xml:"status,attr"`
				Skipped *struct{} `xml:"skipped"`
				Failure *struct{} `xml:"failure"`
				Error   *struct{} `xml:"error"`
			} `xml:"testcase"`
		} `xml:"testsuite"`
	}
	if err := xml.Unmarshal(b, &suites); err != nil {
		return res, fmt.Errorf("junit_01.xml: %w", err)
	}
	for _, s := range suites.Suites {
		for _, tc := range s.Cases {
			// A spec is an It; Ginkgo's suite nodes ([ReportBeforeSuite],
			// [SynchronizedBeforeSuite], [ReportAfterSuite] ...) are not,
			// but one that failed fails the run.
			if !strings.HasPrefix(tc.Name, "[It] ") {
				if tc.Failure != nil || tc.Error != nil || tc.Status == "failed" {
					res.Specs[tc.Name] = "failed"
				}
				continue
			}
			state := tc.Status
			switch {
			case tc.Failure != nil || tc.Error != nil:
				state = "failed"
			case tc.Skipped != nil && state == "":
				state = "skipped"
			case state == "":
				state = "passed"
			}
			if state == "pending" {
				state = "skipped"
			}
			if state != "passed" && state != "skipped" {
				state = "failed"
			}
			res.Specs[tc.Name] = state
		}
	}
	return res, nil
}

// E2EVerdict judges a run on its own: want specs ran (fewer or more means
// the focus no longer selects what it states), none failed.
func E2EVerdict(r E2EResult, want int) error {
	if r.Ran() != want {
		return fmt.Errorf("%d specs ran, want %d (%d passed, %d failed)", r.Ran(), want, r.Count("passed"), r.Count("failed"))
	}
	if f := r.With("failed"); len(f) > 0 {
		return fmt.Errorf("%d of %d specs failed: %s", len(f), want, strings.Join(f, "; "))
	}
	return nil
}

// E2ECompare judges a run against the control's: every spec the control
// passed, the run passed too. It returns the specs that failed on both.
func E2ECompare(run, control E2EResult) (both []string, err error) {
	var worse []string
	for name, s := range control.Specs {
		got := run.Specs[name]
		switch {
		case s == "passed" && got != "passed":
			worse = append(worse, fmt.Sprintf("%s (%s)", name, orNotRun(got)))
		case s == "failed" && got == "failed":
			both = append(both, name)
		}
	}
	sort.Strings(worse)
	sort.Strings(both)
	if len(worse) > 0 {
		return both, fmt.Errorf("%d specs the control passed did not pass: %s", len(worse), strings.Join(worse, "; "))
	}
	return both, nil
}

// FocusOn is a Ginkgo focus that selects the specs named (as E2EResult
// names them, "[It] " and the spec's text) and no other: Ginkgo matches
// the focus against the suite's description, a space and the spec's
// text, without the prefix.
func FocusOn(specs []string) string {
	quoted := make([]string, len(specs))
	for i, s := range specs {
		quoted[i] = "(^| )" + regexp.QuoteMeta(strings.TrimPrefix(s, "[It] ")) + "$"
	}
	return strings.Join(quoted, "|")
}

func orNotRun(s string) string {
	if s == "" {
		return "not run"
	}
	return s
}
