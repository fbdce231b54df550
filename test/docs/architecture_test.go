package docs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/meshwire/meshwire/internal/golden"
)

const module = "github.com/meshwire/meshwire/"

// goPackage is one package of the module as `go list` reports it, its
// path relative to the module.
type goPackage struct {
	Path, Name, Doc string
	// Imports are the project's packages its non-test files import;
	// TestImports those its _test.go files import.
	Imports, TestImports []string
}

var (
	packagesOnce sync.Once
	packagesList []goPackage
	packagesErr  error
)

// packages lists every package of the module, test/ included, once per
// test binary: what it imports in either build, the plain one and the
// one with the kernel tag (the kernel tests', internal/kerneltest).
func packages(t *testing.T) []goPackage {
	t.Helper()
	packagesOnce.Do(func() { packagesList, packagesErr = listPackages() })
	if packagesErr != nil {
		t.Fatal(packagesErr)
	}
	return packagesList
}

// buildTags are the tag sets the module is built with: `make unit` and
// `make test`.
var buildTags = []string{"", "kernel"}

func listPackages() ([]goPackage, error) {
	var pkgs []goPackage
	at := map[string]int{}
	for _, tags := range buildTags {
		list, err := listPackagesTagged(tags)
		if err != nil {
			return nil, err
		}
		for _, p := range list {
			i, ok := at[p.Path]
			if !ok {
				at[p.Path] = len(pkgs)
				pkgs = append(pkgs, p)
				continue
			}
			pkgs[i].Imports = union(pkgs[i].Imports, p.Imports)
			pkgs[i].TestImports = union(pkgs[i].TestImports, p.TestImports)
		}
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].Path < pkgs[j].Path })
	return pkgs, nil
}

// union is a and b's names, sorted, each once.
func union(a, b []string) []string {
	out := append(slices.Clone(a), b...)
	sort.Strings(out)
	return slices.Compact(out)
}

// listPackagesTagged lists the module's packages as built with tags.
func listPackagesTagged(tags string) ([]goPackage, error) {
	cmd := exec.Command("go", "list", "-json", "-tags", tags, "./...")
	cmd.Dir = root
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("go list: %v\n%s", err, errb.String())
	}
	project := func(imports ...[]string) []string {
		deps := []string{}
		for _, list := range imports {
			for _, imp := range list {
				if rest, ok := strings.CutPrefix(imp, module); ok && !slices.Contains(deps, rest) {
					deps = append(deps, rest)
				}
			}
		}
		sort.Strings(deps)
		return deps
	}
	var pkgs []goPackage
	dec := json.NewDecoder(&out)
	for dec.More() {
		var p struct {
			ImportPath, Name, Doc              string
			Imports, TestImports, XTestImports []string
		}
		if err := dec.Decode(&p); err != nil {
			return nil, err
		}
		pkgs = append(pkgs, goPackage{
			Path: strings.TrimPrefix(p.ImportPath, module), Name: p.Name, Doc: p.Doc,
			Imports: project(p.Imports), TestImports: project(p.TestImports, p.XTestImports),
		})
	}
	return pkgs, nil
}

// shipped tells the packages of the shipped code: everything but test/.
func shipped(path string) bool { return !strings.HasPrefix(path, "test/") }

// importGraph lists, for every package of the shipped code, the
// project's packages it imports, as `go list` reports them.
func importGraph(t *testing.T) map[string][]string {
	t.Helper()
	graph := map[string][]string{}
	for _, p := range packages(t) {
		if shipped(p.Path) {
			graph[p.Path] = p.Imports
		}
	}
	return graph
}

const (
	architecture = "docs/architecture.md"
	regenerate   = "MESHWIRE_UPDATE_GOLDEN=1 go test ./test/docs"

	beginImports  = "<!-- BEGIN imports: generated from `go list` by test/docs (MESHWIRE_UPDATE_GOLDEN=1 go test ./test/docs); do not edit -->"
	endImports    = "<!-- END imports -->"
	beginPackages = "<!-- BEGIN packages: generated from `go list` (package docs, import graph) by test/docs (MESHWIRE_UPDATE_GOLDEN=1 go test ./test/docs); do not edit -->"
	endPackages   = "<!-- END packages -->"
	beginLayers   = "<!-- BEGIN layers: written by hand, checked against `go list` by test/docs -->"
	endLayers     = "<!-- END layers -->"
)

// renderGraph is the table of the graph, one package per row.
func renderGraph(g map[string][]string) string {
	var b strings.Builder
	b.WriteString("| package | imports |\n|---|---|\n")
	for _, p := range sortedKeys(g) {
		fmt.Fprintf(&b, "| `%s` | %s |\n", p, codeList(g[p]))
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	var keys []string
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// codeList is names as a comma-separated list of code spans.
func codeList(names []string) string {
	var out []string
	for _, n := range names {
		out = append(out, "`"+n+"`")
	}
	return strings.Join(out, ", ")
}

// purpose is what a package is for: the first sentence of its doc
// comment, without the "Package name" or "Command name" it starts with.
func purpose(p goPackage) string {
	for _, lead := range []string{"Package " + p.Name + " ", "Command " + path.Base(p.Path) + " "} {
		if rest, ok := strings.CutPrefix(p.Doc, lead); ok {
			return rest
		}
	}
	return p.Doc
}

// docProblem says what is wrong with a package's doc comment as the
// table's purpose: missing, not starting with its name, or too long
// for one line.
func docProblem(p goPackage) string {
	const maxPurpose = 300
	switch {
	case p.Doc == "":
		return "has no package doc comment: its first sentence says what the package is for"
	case purpose(p) == p.Doc:
		return fmt.Sprintf("doc comment starts %q: want \"Package %s ...\" (or \"Command %s ...\" for a binary)", firstWords(p.Doc), p.Name, path.Base(p.Path))
	case !strings.HasSuffix(p.Doc, "."):
		return fmt.Sprintf("doc comment's first sentence does not end with a period: %q", p.Doc)
	case len(p.Doc) > maxPurpose:
		return fmt.Sprintf("doc comment's first sentence is %d characters: say what the package is for in at most %d, the details after it", len(p.Doc), maxPurpose)
	}
	return ""
}

func firstWords(s string) string {
	f := strings.Fields(s)
	return strings.Join(f[:min(3, len(f))], " ")
}

// cell escapes what markdown would read as a table's column or an HTML
// tag in a table cell.
var cell = strings.NewReplacer("|", "\\|", "<", "&lt;")

// renderPackages is the package table: each shipped package, what it is
// for (its doc comment) and the shipped packages that import it.
func renderPackages(pkgs []goPackage) string {
	usedBy := map[string][]string{}
	tested := map[string]bool{}
	for _, p := range pkgs {
		for _, d := range p.Imports {
			if shipped(p.Path) {
				usedBy[d] = append(usedBy[d], p.Path)
			} else {
				tested[d] = true
			}
		}
		for _, d := range p.TestImports {
			if d != p.Path {
				tested[d] = true
			}
		}
	}
	var b strings.Builder
	b.WriteString("| package | what it is for | used by |\n|---|---|---|\n")
	for _, p := range pkgs {
		if !shipped(p.Path) {
			continue
		}
		users := codeList(usedBy[p.Path])
		switch {
		case users != "":
		case p.Name == "main":
			users = "(a binary)"
		case tested[p.Path]:
			users = "tests only"
		default:
			users = "nothing"
		}
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", p.Path, cell.Replace(purpose(p)), users)
	}
	return b.String()
}

// TestArchitectureGenerated: the import table and the package table of
// docs/architecture.md are what the code says, every row of them.
func TestArchitectureGenerated(t *testing.T) {
	pkgs := packages(t)
	checkGenerated(t, architecture, beginImports, endImports, renderGraph(importGraph(t)))
	checkGenerated(t, architecture, beginPackages, endPackages, renderPackages(pkgs))
}

// TestPackagesSayWhatTheyAreFor: every shipped package's doc comment
// begins with one sentence saying what it is for, which the package
// table shows.
func TestPackagesSayWhatTheyAreFor(t *testing.T) {
	for _, p := range packages(t) {
		if !shipped(p.Path) {
			continue
		}
		if problem := docProblem(p); problem != "" {
			t.Errorf("%s: %s", p.Path, problem)
		}
	}
}

// checkGenerated fails when the text between begin and end in the file
// at rel (relative to the repository) is not want, listing the lines
// that differ; with MESHWIRE_UPDATE_GOLDEN set it rewrites the file
// instead.
func checkGenerated(t *testing.T, rel, begin, end, want string) {
	t.Helper()
	doc, from, to := section(t, rel, begin, end)
	have := doc[from:to]
	if have == want {
		return
	}
	if os.Getenv("MESHWIRE_UPDATE_GOLDEN") != "" {
		if err := os.WriteFile(filepath.Join(root, rel), []byte(doc[:from]+want+doc[to:]), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s: the section after %.40q... differs from the code (regenerate: %s):\n%s", rel, begin, regenerate, lineDiff(have, want))
}

// section reads the file at rel (relative to the repository) and finds
// the section between the lines begin and end: the file's text, and the
// section's bounds in it (after begin's line break, up to end).
func section(t *testing.T, rel, begin, end string) (doc string, from, to int) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	doc = string(data)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i+len(begin)+1 {
		t.Fatalf("%s has no section between %q and %q", rel, begin, end)
	}
	return doc, i + len(begin) + 1, j
}

// lineDiff lists the lines of want that have lacks and the lines of have
// that want lacks.
func lineDiff(have, want string) string {
	return golden.LineDiff(want, have, "missing: ", "not in the code: ")
}

// layer is one row of the layer table: its name and its packages.
type layer struct {
	name     string
	packages []string
}

// parseLayers reads the layer table of docs/architecture.md, top layer
// first: the layer in the first column, its packages as code spans in
// the second.
func parseLayers(t *testing.T) []layer {
	t.Helper()
	doc, from, to := section(t, architecture, beginLayers, endLayers)
	var layers []layer
	for _, line := range strings.Split(doc[from:to], "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") || strings.TrimSpace(cells[1]) == "layer" {
			continue
		}
		l := layer{name: strings.Trim(strings.TrimSpace(cells[1]), "*")}
		for _, m := range codeSpanRE.FindAllStringSubmatch(cells[2], -1) {
			l.packages = append(l.packages, m[1])
		}
		layers = append(layers, l)
	}
	return layers
}

// TestArchitectureLayers: the layer table of docs/architecture.md names
// every shipped package once and no other, and no package imports a
// package of a layer above its own.
func TestArchitectureLayers(t *testing.T) {
	for _, v := range layerViolations(parseLayers(t), importGraph(t)) {
		t.Errorf("%s's layer table: %s", architecture, v)
	}
}

// layerViolations lists where layers (top first) and the import graph g
// disagree.
func layerViolations(layers []layer, g map[string][]string) []string {
	var out []string
	level := map[string]int{}
	for i, l := range layers {
		for _, p := range l.packages {
			if _, twice := level[p]; twice {
				out = append(out, fmt.Sprintf("%s is in two layers", p))
			}
			level[p] = i
			if _, ok := g[p]; !ok {
				out = append(out, fmt.Sprintf("%s (layer %s) is not a package of the code", p, l.name))
			}
		}
	}
	for _, p := range sortedKeys(g) {
		from, ok := level[p]
		if !ok {
			out = append(out, fmt.Sprintf("%s is in no layer", p))
			continue
		}
		for _, d := range g[p] {
			if to, ok := level[d]; ok && to < from {
				out = append(out, fmt.Sprintf("%s (layer %s) imports %s, in the layer above it (%s)", p, layers[from].name, d, layers[to].name))
			}
		}
	}
	return out
}

// TestLayerCheckFails: the layer check catches an upward import, a
// package left out, one listed twice and one that is gone.
func TestLayerCheckFails(t *testing.T) {
	layers := []layer{{"top", []string{"a"}}, {"bottom", []string{"b", "gone"}}}
	g := map[string][]string{"a": {"b"}, "b": {"a"}, "c": nil}
	v := layerViolations(layers, g)
	want := []string{
		"gone (layer bottom) is not a package of the code",
		"b (layer bottom) imports a, in the layer above it (top)",
		"c is in no layer",
	}
	if !slices.Equal(v, want) {
		t.Errorf("violations = %q, want %q", v, want)
	}
	if v := layerViolations([]layer{{"x", []string{"a", "a"}}}, map[string][]string{"a": nil}); len(v) != 1 {
		t.Errorf("a package in two layers: violations %q", v)
	}
	if v := layerViolations(layers[:1], map[string][]string{"a": {"a"}}); len(v) != 0 {
		t.Errorf("an import within a layer refused: %q", v)
	}
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
			case !strings.HasPrefix(d, "ebpf/") && !slices.Contains(lowHelpers, d):
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
