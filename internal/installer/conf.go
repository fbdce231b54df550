package installer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
)

// Marker is the key meshwire puts, with the value true, in every plugin
// object it adds to another installer's config: it finds them again by it
// (idempotence, re-applying, removal) and never touches an object without
// it. The spec asks plugins to ignore keys they do not know; meshwire's
// portmap, bandwidth and intercept do (cniplugin ignores unknown keys and
// intercept only reads keys named after iptables-init's flags), which the
// end-to-end test checks by running a chained config through the built
// plugins.
const Marker = "meshwire.io/installed"

// OwnConflist is the file meshwire writes without --chain. Runtimes take the
// lexically first .conf/.conflist/.json of the directory; "05-" sorts before
// the "10-" most installers use.
const OwnConflist = "05-meshwire.conflist"

// confExts are the extensions runtimes (containerd, CRI-O through libcni's
// ConfFiles) read from the config directory.
var confExts = []string{".conf", ".conflist", ".json"}

// chainEntries are the plugin objects --chain appends, in this order, each
// only when the config has no plugin of that type of its own. intercept's
// are istio-cni's defaults: with the pod-annotations capability it
// intercepts only pods with a sidecar, capturing everything but the
// sidecar's status ports (15020 outbound; 15020, 15021 and 15090 inbound,
// which the plugin adds for every Istio pod), and the pods' annotations
// refine them. See ChainOptions for what the options add.
func chainEntries(o ChainOptions) []struct{ typ, json string } {
	intercept := `{"type":"intercept","capabilities":{"io.kubernetes.cri.pod-annotations":true},` +
		`"istio-service-cidr":"*","istio-inbound-ports":"*",` +
		`"istio-local-exclude-ports":"15020","istio-local-outbound-ports-exclude":"15020",`
	if len(o.ProxyMetadata) > 0 {
		meta, _ := json.Marshal(o.ProxyMetadata) // a map of strings: keys sorted
		intercept += `"proxyMetadata":` + string(meta) + `,`
	}
	tail := `"` + Marker + `":true}`
	if o.LogFile != "" {
		file, _ := json.Marshal(o.LogFile)
		tail = `"log":{"file":` + string(file) + `},` + tail
	}
	return []struct{ typ, json string }{
		{"portmap", `{"type":"portmap","capabilities":{"portMappings":true},` + tail},
		{"bandwidth", `{"type":"bandwidth","capabilities":{"bandwidth":true},` + tail},
		{"intercept", intercept + tail},
	}
}

// ChainOptions are what `meshwire install` and `meshwire node` add to the
// entries they chain.
type ChainOptions struct {
	// ProxyMetadata is the mesh-wide environment of the sidecars
	// (meshConfig's defaultConfig.proxyMetadata: DNS capture, dual stack,
	// invalid-packet drop), put in intercept's entry; a pod's
	// proxy.istio.io/config overrides it.
	ProxyMetadata map[string]string
	// LogFile, when set, is the plugins' JSON log (the "log" object of
	// every entry), which the node agent reads for its metrics.
	LogFile string
}

// IsConfName reports whether a runtime would read the file name as a
// network config, leaving out hidden files (meshwire's own temporary files
// are hidden, and so are most other installers').
func IsConfName(name string) bool {
	if name == "" || strings.HasPrefix(name, ".") {
		return false
	}
	ext := filepath.Ext(name)
	for _, e := range confExts {
		if ext == e {
			return true
		}
	}
	return false
}

// Primary returns the node's primary config among the file names of the
// config directory: the lexically first config file, as runtimes pick it,
// leaving out meshwire's own conflist. "" when there is none.
func Primary(names []string) string {
	var confs []string
	for _, n := range names {
		if IsConfName(n) && n != OwnConflist {
			confs = append(confs, n)
		}
	}
	if len(confs) == 0 {
		return ""
	}
	sort.Strings(confs)
	return confs[0]
}

// First returns the lexically first config file of names, meshwire's own
// included: the one runtimes use.
func First(names []string) string {
	var confs []string
	for _, n := range names {
		if IsConfName(n) {
			confs = append(confs, n)
		}
	}
	if len(confs) == 0 {
		return ""
	}
	sort.Strings(confs)
	return confs[0]
}

// ConflistName is the name a single-plugin config gets once converted into
// a list: the same base name with the .conflist extension.
func ConflistName(name string) string {
	return strings.TrimSuffix(name, filepath.Ext(name)) + ".conflist"
}

// Edit is what Chain or Unchain made of a config.
type Edit struct {
	Out       []byte   // the new contents (the input itself when unchanged)
	Changed   bool     // Out differs from the input
	Converted bool     // a single-plugin config became a list
	Added     []string // types of the plugins appended, in order
	Removed   []string // types of meshwire's plugins taken out
}

// Chain appends meshwire's plugins (chainEntries, those whose type the
// config lacks) at the end of the config's plugins. A single-plugin config
// becomes a list the way the spec converts one: top-level cniVersion and
// name, the old object as the only plugin. Plugins meshwire added before
// (Marker) are taken out and appended again, so that a second Chain changes
// nothing and a config another installer extended after them gets them
// back at the end.
//
// Everything else is kept byte for byte: the edit splices the plugins array
// of the original text, so untouched keys, plugins, their order and their
// formatting stay as they were.
func Chain(conf []byte) (Edit, error) { return ChainWith(conf, ChainOptions{}) }

// ChainWith is Chain with the options' additions in the entries.
func ChainWith(conf []byte, o ChainOptions) (Edit, error) {
	top, err := parseObject(conf, 0)
	if err != nil {
		return Edit{}, err
	}
	if err := checkVersion(conf, top); err != nil {
		return Edit{}, err
	}
	entries := chainEntries(o)
	if _, ok := top.get("plugins"); !ok {
		return convert(conf, top, entries)
	}
	arr, err := parsePlugins(conf, top)
	if err != nil {
		return Edit{}, err
	}
	kept, removed := arr.split()
	if len(kept) == 0 {
		return Edit{}, errors.New(`"plugins" has no plugin of its own to chain after`)
	}
	have := map[string]bool{}
	for _, i := range kept {
		have[arr.elems[i].typ] = true
	}
	var adds []string
	e := Edit{Removed: removed}
	for _, c := range entries {
		if !have[c.typ] {
			adds = append(adds, c.json)
			e.Added = append(e.Added, c.typ)
		}
	}
	e.Out = arr.splice(conf, kept, adds)
	e.Changed = !bytes.Equal(e.Out, conf)
	return e, nil
}

// Unchain takes out every plugin object meshwire added (those carrying
// Marker) and changes nothing else: the result of Unchain(Chain(x)) is x
// itself for a list, and for a converted single-plugin config a list whose
// only plugin is the original object, byte for byte. A config without
// "plugins" is returned unchanged.
func Unchain(conf []byte) (Edit, error) {
	top, err := parseObject(conf, 0)
	if err != nil {
		return Edit{}, err
	}
	if _, ok := top.get("plugins"); !ok {
		return Edit{Out: conf}, nil
	}
	arr, err := parsePlugins(conf, top)
	if err != nil {
		return Edit{}, err
	}
	kept, removed := arr.split()
	if len(removed) == 0 {
		return Edit{Out: conf}, nil
	}
	out := arr.splice(conf, kept, nil)
	return Edit{Out: out, Changed: !bytes.Equal(out, conf), Removed: removed}, nil
}

// HasMarker reports whether any plugin of a config list carries Marker.
// Input that does not parse has none.
func HasMarker(conf []byte) bool {
	if !bytes.Contains(conf, []byte(Marker)) {
		return false
	}
	top, err := parseObject(conf, 0)
	if err != nil {
		return false
	}
	arr, err := parsePlugins(conf, top)
	if err != nil {
		return false
	}
	_, removed := arr.split()
	return len(removed) > 0
}

// EarlierConversion reports whether list (the contents of the file a
// single-plugin config single converts to) is a conversion of the same
// network: the same name, and, apart from meshwire's plugins, one plugin
// of the same type. Such a file is meshwire's own conversion from an
// earlier run (or one it left behind at cleanup) that the runtime no longer
// reads, since the single config sorts before it; it may be replaced.
func EarlierConversion(list, single []byte) bool {
	lt, err := parseObject(list, 0)
	if err != nil {
		return false
	}
	st, err := parseObject(single, 0)
	if err != nil {
		return false
	}
	arr, err := parsePlugins(list, lt)
	if err != nil {
		return false
	}
	kept, _ := arr.split()
	if len(kept) != 1 {
		return false
	}
	ln, _ := lt.str(list, "name")
	sn, _ := st.str(single, "name")
	stype, _ := st.str(single, "type")
	return ln != "" && ln == sn && stype != "" && arr.elems[kept[0]].typ == stype
}

// convert turns a single plugin's config into a list with meshwire's
// plugins after it.
func convert(conf []byte, top object, entries []struct{ typ, json string }) (Edit, error) {
	typ, ok := top.str(conf, "type")
	if !ok || typ == "" {
		return Edit{}, errors.New(`neither a config list ("plugins") nor a plugin config ("type")`)
	}
	name, ok := top.get("name")
	if !ok {
		return Edit{}, errors.New(`has no "name"; the network's name is needed to convert it into a list`)
	}
	var b bytes.Buffer
	b.WriteString("{\n")
	if v, ok := top.get("cniVersion"); ok {
		fmt.Fprintf(&b, "  \"cniVersion\": %s,\n", v.bytes(conf))
	}
	fmt.Fprintf(&b, "  \"name\": %s,\n", name.bytes(conf))
	b.WriteString("  \"plugins\": [\n    ")
	b.Write(conf[top.start:top.end])
	e := Edit{Converted: true, Changed: true}
	for _, c := range entries {
		if c.typ == typ {
			continue
		}
		b.WriteString(",\n    ")
		b.WriteString(c.json)
		e.Added = append(e.Added, c.typ)
	}
	b.WriteString("\n  ]\n}\n")
	e.Out = b.Bytes()
	return e, nil
}

// checkVersion refuses a config whose spec version predates chaining
// (prevResult came with 0.3.0): meshwire's plugins could not run after it.
func checkVersion(conf []byte, top object) error {
	v, ok := top.str(conf, "cniVersion")
	if !ok {
		return nil
	}
	if v == "0.1.0" || v == "0.2.0" || strings.HasPrefix(v, "0.1.") || strings.HasPrefix(v, "0.2.") {
		return fmt.Errorf("cniVersion %q predates chained plugins (0.3.0); not chaining", v)
	}
	return nil
}

// span is a value's place in the text: data[start:end].
type span struct{ start, end int }

func (s span) bytes(data []byte) []byte { return data[s.start:s.end] }

// object is a JSON object's members with the places of their values.
type object struct {
	span
	keys []string
	vals []span
}

// get returns the value of key (the last one, as encoding/json decides for
// a repeated key).
func (o object) get(key string) (span, bool) {
	for i := len(o.keys) - 1; i >= 0; i-- {
		if o.keys[i] == key {
			return o.vals[i], true
		}
	}
	return span{}, false
}

// str returns key's value when it is a string.
func (o object) str(data []byte, key string) (string, bool) {
	v, ok := o.get(key)
	if !ok {
		return "", false
	}
	var s string
	if json.Unmarshal(v.bytes(data), &s) != nil {
		return "", false
	}
	return s, true
}

// parseObject parses the object that data[off:] holds (nothing but
// whitespace around it), with the places of its members' values.
func parseObject(data []byte, off int) (object, error) {
	var o object
	text := data[off:]
	if !json.Valid(text) {
		err := json.Unmarshal(text, new(any))
		return o, fmt.Errorf("not valid JSON: %v", err)
	}
	dec := json.NewDecoder(bytes.NewReader(text))
	tok, err := dec.Token()
	if err != nil {
		return o, fmt.Errorf("not valid JSON: %v", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return o, errors.New("not a JSON object")
	}
	o.start = off + int(dec.InputOffset()) - 1
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return o, err
		}
		key, _ := tok.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return o, err
		}
		end := off + int(dec.InputOffset())
		v := span{end - len(raw), end}
		if !bytes.Equal(v.bytes(data), raw) {
			return o, fmt.Errorf("internal error: value of %q misplaced", key)
		}
		o.keys, o.vals = append(o.keys, key), append(o.vals, v)
	}
	if _, err := dec.Token(); err != nil {
		return o, err
	}
	o.end = off + int(dec.InputOffset())
	if _, err := dec.Token(); err != io.EOF {
		return o, errors.New("not valid JSON: data after the object")
	}
	return o, nil
}

// pluginList is a config list's "plugins" array.
type pluginList struct {
	span
	elems []plugin
}

type plugin struct {
	span
	typ    string
	marked bool // carries Marker: true
}

// parsePlugins finds the elements of top's "plugins" array.
func parsePlugins(data []byte, top object) (pluginList, error) {
	v, ok := top.get("plugins")
	if !ok {
		return pluginList{}, errors.New(`has no "plugins"`)
	}
	arr := pluginList{span: v}
	text := v.bytes(data)
	dec := json.NewDecoder(bytes.NewReader(text))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return arr, errors.New(`"plugins" is not a list`)
	}
	for i := 0; dec.More(); i++ {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return arr, fmt.Errorf("plugins[%d]: %v", i, err)
		}
		end := v.start + int(dec.InputOffset())
		p := plugin{span: span{end - len(raw), end}}
		if !bytes.Equal(p.bytes(data), raw) {
			return arr, fmt.Errorf("internal error: plugins[%d] misplaced", i)
		}
		if o, err := parseObject(data[:p.end], p.start); err == nil {
			p.typ, _ = o.str(data, "type")
			if m, ok := o.get(Marker); ok {
				var b bool
				p.marked = json.Unmarshal(m.bytes(data), &b) == nil && b
			}
		}
		arr.elems = append(arr.elems, p)
	}
	return arr, nil
}

// split returns the indexes of the elements without Marker and the types
// of those with it.
func (a pluginList) split() (kept []int, marked []string) {
	for i, p := range a.elems {
		if p.marked {
			marked = append(marked, p.typ)
		} else {
			kept = append(kept, i)
		}
	}
	return kept, marked
}

// splice returns data with the plugins array rewritten to hold the kept
// elements, then adds. Text between kept elements is the original's (the
// separator in front of each kept element, the whitespace after the last);
// an added element goes after ", " plus the whitespace found in front of
// the last kept element, so that removing it again restores the original.
func (a pluginList) splice(data []byte, kept []int, adds []string) []byte {
	arr := data[a.start:a.end]
	rel := func(s span) span { return span{s.start - a.start, s.end - a.start} }
	var b bytes.Buffer
	b.WriteByte('[')
	var indent []byte
	for n, i := range kept {
		e := rel(a.elems[i].span)
		if n == 0 {
			// The whitespace after the opening bracket, also when the
			// elements before this one went.
			indent = arr[1:rel(a.elems[0].span).start]
			b.Write(indent)
		} else {
			// The separator in front of it in the original.
			sep := arr[rel(a.elems[i-1].span).end:e.start]
			b.Write(sep)
			_, indent, _ = bytes.Cut(sep, []byte(","))
		}
		b.Write(arr[e.start:e.end])
	}
	for _, add := range adds {
		b.WriteByte(',')
		b.Write(indent)
		b.WriteString(add)
	}
	if len(a.elems) > 0 {
		b.Write(arr[rel(a.elems[len(a.elems)-1].span).end : len(arr)-1])
	} else {
		b.Write(arr[1 : len(arr)-1])
	}
	b.WriteByte(']')
	out := make([]byte, 0, len(data)+b.Len())
	out = append(out, data[:a.start]...)
	out = append(out, b.Bytes()...)
	return append(out, data[a.end:]...)
}

// WithLog returns the conflist with a "log" object naming file in every
// plugin that has none: meshwire's own conflist, when the node agent reads
// the plugins' log. Only meshwire's plugins read the key.
func WithLog(conflist []byte, file string) ([]byte, error) {
	top, plugins, err := decodeConflist(conflist)
	if err != nil {
		return nil, err
	}
	for i, p := range plugins {
		obj, ok := p.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("plugins[%d] is not an object", i)
		}
		if _, has := obj["log"]; !has {
			obj["log"] = map[string]string{"file": file}
		}
	}
	out, err := json.MarshalIndent(top, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(out, '\n'), nil
}

// decodeConflist decodes a conflist keeping its numbers as written, and
// returns it with its plugins list.
func decodeConflist(conflist []byte) (top map[string]any, plugins []any, err error) {
	d := json.NewDecoder(bytes.NewReader(conflist))
	d.UseNumber()
	if err := d.Decode(&top); err != nil {
		return nil, nil, fmt.Errorf("not a JSON object: %w", err)
	}
	plugins, ok := top["plugins"].([]any)
	if !ok {
		return nil, nil, errors.New(`no "plugins" list`)
	}
	return top, plugins, nil
}
