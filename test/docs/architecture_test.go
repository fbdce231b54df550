package docs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

const module = "github.com/meshwire/meshwire/"

// importGraph lists, for every package of the shipped code (everything
// but test/), the project's packages it imports, as `go list` reports
// them.
func importGraph(t *testing.T) map[string][]string {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = root
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list: %v\n%s", err, errb.String())
	}
	graph := map[string][]string{}
	dec := json.NewDecoder(&out)
	for dec.More() {
		var p struct {
			ImportPath string
			Imports    []string
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkg := strings.TrimPrefix(p.ImportPath, module)
		if strings.HasPrefix(pkg, "test/") {
			continue
		}
		deps := []string{}
		for _, imp := range p.Imports {
			if rest, ok := strings.CutPrefix(imp, module); ok {
				deps = append(deps, rest)
			}
		}
		sort.Strings(deps)
		graph[pkg] = deps
	}
	return graph
}

const (
	beginImports = "<!-- BEGIN imports: generated from `go list` by test/docs (MESHWIRE_UPDATE_GOLDEN=1 go test ./test/docs); do not edit -->"
	endImports   = "<!-- END imports -->"
)

// renderGraph is the table of the graph, one package per row.
func renderGraph(g map[string][]string) string {
	var pkgs []string
	for p := range g {
		pkgs = append(pkgs, p)
	}
	sort.Strings(pkgs)
	var b strings.Builder
	b.WriteString("| package | imports |\n|---|---|\n")
	for _, p := range pkgs {
		var deps []string
		for _, d := range g[p] {
			deps = append(deps, "`"+d+"`")
		}
		fmt.Fprintf(&b, "| `%s` | %s |\n", p, strings.Join(deps, ", "))
	}
	return b.String()
}

// TestArchitectureImports: the import table of docs/architecture.md is
// the import graph of the code, every edge of it and no other.
func TestArchitectureImports(t *testing.T) {
	path := filepath.Join(root, "docs", "architecture.md")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	i, j := strings.Index(doc, beginImports), strings.Index(doc, endImports)
	if i < 0 || j < i {
		t.Fatalf("%s has no import table between %q and %q", path, beginImports, endImports)
	}
	have := doc[i+len(beginImports)+1 : j]
	want := renderGraph(importGraph(t))
	if have == want {
		return
	}
	if os.Getenv("MESHWIRE_UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(path, []byte(doc[:i+len(beginImports)+1]+want+doc[j:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	hl, wl := strings.Split(have, "\n"), strings.Split(want, "\n")
	var diff []string
	for _, l := range wl {
		if !contains(hl, l) {
			diff = append(diff, "missing: "+l)
		}
	}
	for _, l := range hl {
		if !contains(wl, l) {
			diff = append(diff, "not in the code: "+l)
		}
	}
	t.Fatalf("docs/architecture.md's import table differs from the code (regenerate: MESHWIRE_UPDATE_GOLDEN=1 go test ./test/docs):\n%s", strings.Join(diff, "\n"))
}

func contains(lines []string, l string) bool {
	for _, x := range lines {
		if x == l {
			return true
		}
	}
	return false
}

// lowHelpers are the packages outside ebpf/ that ebpf/ may import: low
// helpers that know nothing of interception, plugins or commands.
var lowHelpers = []string{"internal/filelock", "internal/netns", "internal/recordfile"}

// TestEBPFIsALowerLayer: nothing in ebpf/ imports upward (interception,
// plugins, commands: anything but ebpf/ and lowHelpers), and the two
// programs' loaders share ebpf/loader rather than import each other.
func TestEBPFIsALowerLayer(t *testing.T) {
	for _, v := range lowerLayerViolations(importGraph(t)) {
		t.Error(v)
	}
}

// lowerLayerViolations lists the imports of g that break the layering.
func lowerLayerViolations(g map[string][]string) []string {
	var out []string
	for pkg, deps := range g {
		if !strings.HasPrefix(pkg, "ebpf/") {
			continue
		}
		for _, d := range deps {
			switch {
			case !strings.HasPrefix(d, "ebpf/") && !contains(lowHelpers, d):
				out = append(out, fmt.Sprintf("%s imports %s: ebpf/ is a lower layer (it may import ebpf/ and %s only)", pkg, d, strings.Join(lowHelpers, ", ")))
			case pkg == "ebpf/capture" && strings.HasPrefix(d, "ebpf/fastpath"),
				pkg == "ebpf/fastpath" && strings.HasPrefix(d, "ebpf/capture"):
				out = append(out, fmt.Sprintf("%s imports %s: the loaders share ebpf/loader, not each other", pkg, d))
			}
		}
	}
	sort.Strings(out)
	return out
}

// TestLowerLayerCheckFails: the check catches an upward import and a
// sideways one between the loaders.
func TestLowerLayerCheckFails(t *testing.T) {
	for _, g := range []map[string][]string{
		{"ebpf/capture/pods": {"internal/intercept"}},
		{"ebpf/capture": {"ebpf/fastpath"}},
		{"ebpf/fastpath": {"ebpf/capture/pods"}},
	} {
		if len(lowerLayerViolations(g)) == 0 {
			t.Errorf("the check passes %v", g)
		}
	}
	if v := lowerLayerViolations(map[string][]string{"ebpf/capture": {"ebpf/loader", "internal/netns"}, "internal/intercept/apply": {"ebpf/capture/pods"}}); len(v) != 0 {
		t.Errorf("the check refuses allowed imports: %v", v)
	}
}
