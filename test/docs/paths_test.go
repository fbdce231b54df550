package docs

import (
	"bufio"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// topDirs are the repository's top-level folders: a path that starts with
// one of them names a file or folder of the repository.
const topDirs = `cmd|conf|docs|ebpf|internal|iptables-init|plugins|test`

// repoPathRE finds a path of the repository anywhere in a line of
// markdown (code spans, prose, code blocks): one of topDirs and a slash
// at the start of a word (after a space, a bracket, a quote, `=`, `./`
// ...; not inside another path or a URL), then the path, which may hold
// globs and {a,b} alternatives, then an optional :LINE or :LINE-LINE.
// Group 1 is the path, groups 2 and 3 the lines.
var repoPathRE = regexp.MustCompile("(?:^|[\\s(\\[\"'=,;`<>*]|\\./)((?:" + topDirs + `)/(?:\{[^}\s]*\}|[A-Za-z0-9_.*?/\[\]-])*)(?::(\d+)(?:-(\d+))?)?`)

// pathRef is a path a document names, as it names it.
type pathRef struct {
	path     string // relative to the repository
	from, to int    // the lines it names (0: none)
}

// findPathRefs lists the paths of the repository that line names: its
// trailing punctuation dropped, and a Go package pattern's "/..." too.
func findPathRefs(line string) []pathRef {
	var refs []pathRef
	for _, m := range repoPathRE.FindAllStringSubmatch(line, -1) {
		r := pathRef{path: strings.TrimRight(m[1], ".,;)]")}
		r.path = strings.TrimSuffix(r.path, "/...")
		r.path = strings.TrimSuffix(r.path, "/")
		r.from, _ = strconv.Atoi(m[2])
		r.to, _ = strconv.Atoi(m[3])
		refs = append(refs, r)
	}
	return refs
}

// placeholder is a path element written as a placeholder, NAME or
// PLUGIN: any name.
var placeholder = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)

// expand turns a path's {a,b} alternatives into one pattern per
// alternative, and placeholders into globs.
func expand(path string) []string {
	if i := strings.Index(path, "{"); i >= 0 {
		if j := strings.Index(path[i:], "}"); j > 0 {
			var out []string
			for _, alt := range strings.Split(path[i+1:i+j], ",") {
				out = append(out, expand(path[:i]+alt+path[i+j+1:])...)
			}
			return out
		}
	}
	parts := strings.Split(path, "/")
	for i, p := range parts {
		if placeholder.MatchString(p) {
			parts[i] = "*"
		}
	}
	return []string{strings.Join(parts, "/")}
}

// checkPathRef says what is wrong with r, relative to dir: a pattern
// that matches nothing, a file that is not there, a line past its end.
func checkPathRef(dir string, r pathRef) string {
	for _, pat := range expand(r.path) {
		if strings.ContainsAny(pat, "*?[") {
			if m, err := filepath.Glob(filepath.Join(dir, pat)); err != nil || len(m) == 0 {
				return fmt.Sprintf("%s matches nothing in the repository", r.path)
			}
			continue
		}
		info, err := os.Stat(filepath.Join(dir, pat))
		if err != nil {
			return fmt.Sprintf("%s is not in the repository", pat)
		}
		if r.from == 0 {
			continue
		}
		if info.IsDir() {
			return fmt.Sprintf("%s:%d: a line of a folder", pat, r.from)
		}
		n, err := countLines(filepath.Join(dir, pat))
		if err != nil {
			return err.Error()
		}
		if last := max(r.from, r.to); last > n {
			return fmt.Sprintf("%s has %d lines, not %d", pat, n, last)
		}
	}
	return ""
}

func countLines(path string) (int, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		n++
	}
	return n, sc.Err()
}

// TestDocPathsExist: every file and folder of the repository that
// README.md and docs/*.md name (in code spans, with a :line, arguments
// or a glob, in prose and in code blocks) is there, and a :line is one of
// the file's.
func TestDocPathsExist(t *testing.T) {
	refs := 0
	for _, file := range markdownFiles(t) {
		data, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(string(data), "\n") {
			for _, r := range findPathRefs(line) {
				refs++
				if problem := checkPathRef(root, r); problem != "" {
					t.Errorf("%s:%d: %s", file, n+1, problem)
				}
			}
		}
	}
	if refs < 500 {
		t.Errorf("only %d paths named in the pages: is the pattern broken?", refs)
	}
}

// TestFindPathRefs: the forms a page names a path in.
func TestFindPathRefs(t *testing.T) {
	for line, want := range map[string][]pathRef{
		"see `internal/firewall/host.go:120` and `test/bench/perfblocks.sh record /tmp/prof`":     {{path: "internal/firewall/host.go", from: 120}, {path: "test/bench/perfblocks.sh"}},
		"(test/e2e/chaos_test.go: the named points), `go vet ./test/docs/...`.":                   {{path: "test/e2e/chaos_test.go"}, {path: "test/docs"}},
		"`plugins/{main,ipam,meta}/NAME` and `internal/intercept/testdata/golden/*.golden`":       {{path: "plugins/{main,ipam,meta}/NAME"}, {path: "internal/intercept/testdata/golden/*.golden"}},
		"lines `cmd/meshwire/cli/cli.go:10-20`, not github.com/x/internal/y nor https://a/test/b": {{path: "cmd/meshwire/cli/cli.go", from: 10, to: 20}},
	} {
		if got := findPathRefs(line); !slices.Equal(got, want) {
			t.Errorf("findPathRefs(%q)\n = %+v\nwant %+v", line, got, want)
		}
	}
	for r, want := range map[pathRef]string{
		{path: "test/docs/links_test.go"}:                 "",
		{path: "test/docs/links_test.go", from: 1, to: 3}: "",
		{path: "plugins/{main,ipam,meta}/NAME"}:           "",
		{path: "test/docs/nothing_test.go"}:               "test/docs/nothing_test.go is not in the repository",
		{path: "test/docs/links_test.go", from: 100000}:   "test/docs/links_test.go has",
		{path: "plugins/{main,nope}/NAME"}:                "plugins/{main,nope}/NAME matches nothing",
		{path: "test/docs/*.nothing"}:                     "matches nothing",
	} {
		got := checkPathRef(root, r)
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("checkPathRef(%+v) = %q, want %q", r, got, want)
		}
	}
}

// goFileRE finds a Go file name in a comment: a word ending in .go,
// perhaps with a path before it, at the start of a word.
var goFileRE = regexp.MustCompile("(?:^|[\\s(\\[\"'`,;])([A-Za-z0-9_./{},-]*[A-Za-z0-9_]\\.go)\\b")

// ourDirRE finds the repository's folders a comment names.
var ourDirRE = regexp.MustCompile("(?:^|[\\s(\\[\"'`,;])((?:" + topDirs + `)/[A-Za-z0-9_./-]*[A-Za-z0-9_])`)

// citedGoFiles lists the Go files a comment's text cites that are not
// where it says: a path of the repository (one of topDirs first) that is
// not there, or a bare name that is neither in dir (the comment's
// package) nor in a folder of the repository the comment names. Paths of
// other repositories (cni/pkg/..., sigs.k8s.io/...) are not checked.
func citedGoFiles(repo, dir, text string) []string {
	// A path broken at a slash continues on the next line.
	text = strings.ReplaceAll(text, "/\n", "/")
	var dirs []string
	for _, m := range ourDirRE.FindAllStringSubmatch(text, -1) {
		dirs = append(dirs, filepath.Join(repo, m[1]))
	}
	var bad []string
	for _, m := range goFileRE.FindAllStringSubmatch(text, -1) {
		name := m[1]
		switch {
		case strings.HasPrefix(name, "_"), strings.HasPrefix(name, "."):
			continue // a pattern: "its _test.go files"
		case strings.Contains(name, "/"):
			first, _, _ := strings.Cut(name, "/")
			if !regexp.MustCompile(`^(?:` + topDirs + `)$`).MatchString(first) {
				continue // another repository's
			}
			if checkPathRef(repo, pathRef{path: name}) != "" {
				bad = append(bad, name)
			}
		default:
			found := false
			for _, d := range append([]string{dir}, dirs...) {
				if _, err := os.Stat(filepath.Join(d, name)); err == nil {
					found = true
					break
				}
			}
			if !found {
				bad = append(bad, name)
			}
		}
	}
	return bad
}

// TestGoCommentsCiteFiles: every Go file a comment of the module's code
// cites by name is there (a comment that names a file of its own package,
// or of a folder it names, or a path of the repository).
func TestGoCommentsCiteFiles(t *testing.T) {
	files := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "bin") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != root {
				return filepath.SkipDir // a module of its own (test/cluster/critest), as for go list ./...
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		files++
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		for _, g := range f.Comments {
			for _, name := range citedGoFiles(root, filepath.Dir(path), g.Text()) {
				t.Errorf("%s: a comment cites %s, which is not there", rel, name)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 100 {
		t.Errorf("only %d Go files read", files)
	}
}

// TestCitedGoFiles: what a comment may cite, and what it may not.
func TestCitedGoFiles(t *testing.T) {
	dir := filepath.Join(root, "test", "docs")
	for text, want := range map[string][]string{
		"the tables (links_test.go), as paths_test.go does":                 nil,
		"the notes of flagnotes.go":                                         {"flagnotes.go"},
		"the names are in internal/attachment (reference.go)":               nil,
		"the names are in internal/refrules (reference.go)":                 {"reference.go"},
		"see test/docs/links_test.go and test/docs/gone_test.go":            {"test/docs/gone_test.go"},
		"istio-cni's cni/pkg/nodeagent/\nztunnelserver.go and its _test.go": nil,
		"test/docs/\nlinks_test.go":                                         nil,
	} {
		if got := citedGoFiles(root, dir, text); !slices.Equal(got, want) {
			t.Errorf("citedGoFiles(%q) = %q, want %q", text, got, want)
		}
	}
}
