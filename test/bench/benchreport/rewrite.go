package main

import (
	"fmt"
	"regexp"
	"strings"
)

// marker is a line <!-- bench:NAME --> (begin) or <!-- /bench:NAME -->
// (end).
var marker = regexp.MustCompile(`^<!-- (/?)bench:([a-z0-9-]+) -->$`)

// Rewrite replaces what lies between each pair of markers in doc with
// the block of that name, generated from r. It fails on a marker without
// its pair, a nested one, or an unknown name, and when a block cannot be
// generated; it returns the names it wrote.
func Rewrite(doc string, r *Run) (string, []string, error) {
	lines := strings.SplitAfter(doc, "\n")
	var out strings.Builder
	var names []string
	open := ""
	openLine := 0
	for i, l := range lines {
		m := marker.FindStringSubmatch(strings.TrimRight(l, "\n"))
		switch {
		case m == nil && open != "":
			continue // the old block: dropped
		case m == nil:
			out.WriteString(l)
		case m[1] == "" && open != "":
			return "", nil, fmt.Errorf("line %d: bench:%s begins inside bench:%s (line %d)", i+1, m[2], open, openLine)
		case m[1] == "":
			gen, ok := blocks[m[2]]
			if !ok {
				return "", nil, fmt.Errorf("line %d: unknown block bench:%s", i+1, m[2])
			}
			text, err := gen(r)
			if err != nil {
				return "", nil, fmt.Errorf("line %d, bench:%s: %w", i+1, m[2], err)
			}
			out.WriteString(l)
			out.WriteString("\n" + strings.TrimRight(text, "\n") + "\n\n")
			open, openLine = m[2], i+1
			names = append(names, m[2])
		case m[2] != open:
			return "", nil, fmt.Errorf("line %d: /bench:%s ends no open block", i+1, m[2])
		default:
			out.WriteString(l)
			open = ""
		}
	}
	if open != "" {
		return "", nil, fmt.Errorf("line %d: bench:%s has no end marker <!-- /bench:%s -->", openLine, open, open)
	}
	return out.String(), names, nil
}
