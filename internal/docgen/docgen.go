// Package docgen rewrites the generated sections of the docs: the text
// between a BEGIN marker and an END marker, made from the code (the flag
// tables of docs/iptables-init.md and docs/meshwire.md). Each generator
// is a `go generate` program whose main is Main.
package docgen

import (
	"bytes"
	"fmt"
	"os"
)

// Splice returns doc with the text between begin and end replaced by
// text, set off by a blank line from the begin marker.
func Splice(doc []byte, begin, end, text string) ([]byte, error) {
	b := bytes.Index(doc, []byte(begin))
	e := bytes.Index(doc, []byte(end))
	if b < 0 || e < b {
		return nil, fmt.Errorf("no %q ... %q markers in order", begin, end)
	}
	var out bytes.Buffer
	out.Write(doc[:b+len(begin)])
	out.WriteString("\n\n")
	out.WriteString(text)
	out.WriteString("\n")
	out.Write(doc[e:])
	return out.Bytes(), nil
}

// Main rewrites the file its one argument names with splice, and exits:
// 2 for a usage error, 1 when the file cannot be read, spliced or written.
func Main(splice func(doc []byte) ([]byte, error)) {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: gendoc FILE.md")
		os.Exit(2)
	}
	path := os.Args[1]
	doc, err := os.ReadFile(path)
	if err == nil {
		doc, err = splice(doc)
	}
	if err == nil {
		err = os.WriteFile(path, doc, 0o644)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gendoc: %s: %v\n", path, err)
		os.Exit(1)
	}
}
