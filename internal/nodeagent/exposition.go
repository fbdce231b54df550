package nodeagent

import (
	"bytes"
	"math"
	"strconv"
	"strings"
)

// exposition writes Prometheus' text exposition format (version 0.0.4):
// per family a HELP and a TYPE line, then its samples.
//
// Written here rather than with prometheus/client_golang: that library
// adds 2.2 MB (31%) to the meshwire binary (7.0 MB to 9.2 MB, stripped,
// measured 2026-11-25 with promhttp imported), for a handful of values the
// agent reads from the kernel and the plugins' log at each scrape. The
// tests parse this output with Prometheus' own parser (prometheus/common's
// expfmt).
type exposition struct{ b bytes.Buffer }

// ContentType is the text format's media type.
const contentType = "text/plain; version=0.0.4; charset=utf-8"

var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

func (e *exposition) family(name, typ, help string) {
	e.b.WriteString("# HELP " + name + " " + helpEscaper.Replace(help) + "\n")
	e.b.WriteString("# TYPE " + name + " " + typ + "\n")
}

// sample writes one sample; labels are name, value pairs.
func (e *exposition) sample(name string, v float64, labels ...string) {
	e.b.WriteString(name)
	if len(labels) > 0 {
		e.b.WriteByte('{')
		for i := 0; i+1 < len(labels); i += 2 {
			if i > 0 {
				e.b.WriteByte(',')
			}
			e.b.WriteString(labels[i] + `="` + labelEscaper.Replace(labels[i+1]) + `"`)
		}
		e.b.WriteByte('}')
	}
	e.b.WriteByte(' ')
	switch {
	case math.IsInf(v, 1):
		e.b.WriteString("+Inf")
	case math.IsInf(v, -1):
		e.b.WriteString("-Inf")
	case math.IsNaN(v):
		e.b.WriteString("NaN")
	default:
		e.b.WriteString(strconv.FormatFloat(v, 'g', -1, 64))
	}
	e.b.WriteByte('\n')
}

// gauge writes a family of one unlabelled sample.
func (e *exposition) single(name, typ, help string, v float64) {
	e.family(name, typ, help)
	e.sample(name, v)
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
