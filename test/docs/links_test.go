// Package docs checks the project's markdown: every relative link and
// anchor in README.md and docs/*.md leads somewhere, every page under
// docs/ is linked from somewhere, and every path of the repository the
// pages and the Go comments name is there. It needs neither root nor the
// network.
package docs

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

const root = "../.."

var (
	// linkRE matches an inline link or image target: [text](target) or
	// [text](target "title").
	linkRE = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// codeSpanRE matches inline code, whose text is never a link; its
	// group is the code.
	codeSpanRE = regexp.MustCompile("`([^`]*)`")
	// headingLinkRE is a link inside a heading: only its text counts.
	headingLinkRE = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)
)

// page is one markdown file: its headings' anchors and its links.
type page struct {
	anchors map[string]bool
	links   []link
}

type link struct {
	line   int
	target string
}

// parse reads the headings and links of a markdown file, outside code
// fences and code spans.
func parse(text string) page {
	p := page{anchors: map[string]bool{}}
	seen := map[string]int{}
	fence := ""
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) {
				fence = ""
			}
			continue
		}
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			fence = trimmed[:3]
			continue
		}
		if strings.HasPrefix(line, "#") {
			title := strings.TrimSpace(strings.TrimLeft(line, "#"))
			slug := Slug(title)
			if n := seen[slug]; n > 0 {
				p.anchors[fmt.Sprintf("%s-%d", slug, n)] = true
			} else {
				p.anchors[slug] = true
			}
			seen[slug]++
		}
		for _, m := range linkRE.FindAllStringSubmatch(codeSpanRE.ReplaceAllString(line, ""), -1) {
			p.links = append(p.links, link{line: i + 1, target: m[1]})
		}
	}
	return p
}

// Slug is the anchor GitHub gives a heading: lower case, punctuation other
// than '-' and '_' dropped, spaces turned into '-'.
func Slug(title string) string {
	title = headingLinkRE.ReplaceAllString(title, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(title) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// markdownFiles is README.md and every docs/*.md, relative to root.
func markdownFiles(t *testing.T) []string {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"README.md"}
	for _, d := range docs {
		rel, _ := filepath.Rel(root, d)
		files = append(files, filepath.ToSlash(rel))
	}
	return files
}

func TestLinksResolve(t *testing.T) {
	pages := map[string]page{}
	load := func(rel string) (page, error) {
		if p, ok := pages[rel]; ok {
			return p, nil
		}
		b, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			return page{}, err
		}
		p := parse(string(b))
		pages[rel] = p
		return p, nil
	}
	linked := map[string]bool{}
	files := markdownFiles(t)
	for _, file := range files {
		p, err := load(file)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range p.links {
			if strings.Contains(l.target, "://") || strings.HasPrefix(l.target, "mailto:") {
				continue // not checked: no network in tests
			}
			path, anchor, _ := strings.Cut(l.target, "#")
			target := file
			if path != "" {
				target = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(file), path)))
				if strings.HasPrefix(target, "../") {
					t.Errorf("%s:%d: %s leaves the repository", file, l.line, l.target)
					continue
				}
				if _, err := os.Stat(filepath.Join(root, target)); err != nil {
					t.Errorf("%s:%d: %s: no such file %s", file, l.line, l.target, target)
					continue
				}
			}
			if target != file {
				linked[target] = true
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(target, ".md") {
				t.Errorf("%s:%d: %s: an anchor into a file that is not markdown", file, l.line, l.target)
				continue
			}
			tp, err := load(target)
			if err != nil {
				t.Errorf("%s:%d: %s: %v", file, l.line, l.target, err)
				continue
			}
			if !tp.anchors[anchor] {
				t.Errorf("%s:%d: %s: %s has no heading with anchor #%s", file, l.line, l.target, target, anchor)
			}
		}
	}
	for _, file := range files {
		if file != "README.md" && !linked[file] {
			t.Errorf("%s is linked from neither README.md nor another page of docs/", file)
		}
	}
}

func TestSlug(t *testing.T) {
	for title, want := range map[string]string{
		"The `meshwire` command":                           "the-meshwire-command",
		"bridge + host-local":                              "bridge--host-local",
		"splice() and `--into-proxy`":                      "splice-and---into-proxy",
		"Deliberate differences from the reference v1.9.1": "deliberate-differences-from-the-reference-v191",
		"add, check, del, ls, gc":                          "add-check-del-ls-gc",
		"See [fastpath](fastpath.md)":                      "see-fastpath",
	} {
		if got := Slug(title); got != want {
			t.Errorf("Slug(%q) = %q, want %q", title, got, want)
		}
	}
}

// TestParseSkipsCode: links and headings inside code do not count.
func TestParseSkipsCode(t *testing.T) {
	p := parse("# Title\n\n```sh\n# comment\n[a](nowhere.md)\n```\n\n`[b](nowhere.md)` and [c](here.md)\n")
	if !p.anchors["title"] || p.anchors["comment"] {
		t.Errorf("anchors = %v, want only title", p.anchors)
	}
	if len(p.links) != 1 || p.links[0].target != "here.md" || p.links[0].line != 8 {
		t.Errorf("links = %+v, want here.md on line 8", p.links)
	}
}
