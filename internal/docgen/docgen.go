// Package docgen rewrites the generated sections of the docs: the text
// between a BEGIN marker and an END marker, made from the code (the flag
// tables of docs/iptables-init.md and docs/meshwire.md), by the one
// generator, gendoc, which `go generate` runs.
package docgen

import (
	"bytes"
	"fmt"
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
