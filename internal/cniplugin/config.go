// Config decoding, with errors that name the field at fault.
//
// Every plugin config embeds Base: the spec's common keys plus meshwire's
// optional "log" object. Decode turns undecodable input into code 6 and a
// well-formed config with a bad value (wrong JSON type, wrong plugin type, bad
// log settings, an unparsable prevResult) into code 7. Unknown keys are
// ignored, as the spec asks: runtimes add keys of their own.

package cniplugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/logging"
)

// Base is the part of the config every meshwire plugin shares.
type Base struct {
	types.PluginConf
	Log *logging.Config `json:"log,omitempty"`
}

// Conf is implemented by every struct that embeds Base.
type Conf interface{ base() *Base }

func (b *Base) base() *Base { return b }

// Decode parses data into conf and validates the shared part. pluginType is
// the plugin's own name; the config's "type" must be that name or the name the
// binary was installed under (runtimes find a plugin by its type, so a renamed
// binary sees its new name there).
func Decode(data []byte, pluginType string, conf Conf) error {
	if err := Unmarshal(data, conf, ""); err != nil {
		return err
	}
	b := conf.base()
	if !typeAccepted(b.Type, pluginType) {
		return cnierr.Field("type", "%q is not a type this plugin serves (this is meshwire's %q plugin)", b.Type, pluginType)
	}
	if err := b.Log.Validate(); err != nil {
		return cnierr.Field("log."+err.Field, "%s", err.Msg)
	}
	return ParsePrevResult(&b.PluginConf)
}

// ParsePrevResult parses the config's prevResult, when there is one, into
// pc.PrevResult. What the library's decoding and conversion would accept
// but no plugin can use (a null or non-object entry in interfaces, ips or
// routes, an ip without an address) is code 7 naming the entry for ADD,
// CHECK and the rest; for DEL, which must always finish the job (the
// runtime passes the result it cached, whatever it holds), such entries
// are dropped, logged, and DEL goes on. The library's conversion between
// spec versions dereferences them, so they are found on the raw JSON. An
// ip whose interface index names no interface is taken as naming none, as
// the reference plugins take it (chained after other plugins, meshwire
// meets such results).
func ParsePrevResult(pc *types.PluginConf) error {
	if pc.RawPrevResult == nil {
		return nil
	}
	lenient := command() == "DEL"
	for _, list := range []string{"interfaces", "ips", "routes"} {
		v, ok := pc.RawPrevResult[list]
		if !ok || v == nil {
			continue
		}
		entries, ok := v.([]any)
		if !ok {
			if lenient {
				slog.Warn("prevResult: a list expected, dropped", "field", "prevResult."+list, "got", jsonValueKind(v))
				delete(pc.RawPrevResult, list)
				continue
			}
			return cnierr.Field("prevResult."+list, "expected a list, got %s", jsonValueKind(v))
		}
		kept := entries[:0:0]
		for i, e := range entries {
			field := fmt.Sprintf("prevResult.%s[%d]", list, i)
			m, ok := e.(map[string]any)
			why := ""
			switch {
			case !ok:
				why = "expected an object, got " + jsonValueKind(e)
			case list == "ips" && !isNonEmptyString(m["address"]):
				field, why = field+".address", "missing"
			}
			if why == "" {
				kept = append(kept, e)
				continue
			}
			if !lenient {
				return cnierr.Field(field, "%s", why)
			}
			slog.Warn("prevResult: entry dropped", "field", field, "why", why)
			if list == "interfaces" {
				kept = append(kept, map[string]any{}) // the ips' indexes stay right
			}
		}
		pc.RawPrevResult[list] = kept
	}
	err := cnierr.Catch(func() error { return version.ParsePrevResult(pc) })
	if err != nil {
		return cnierr.Field("prevResult", "%v", err)
	}
	if _, err := current.NewResultFromResult(pc.PrevResult); err != nil {
		return cnierr.Field("prevResult", "cannot convert to CNI %s: %v", current.ImplementedSpecVersion, err)
	}
	return nil
}

// command is the CNI command of this process (tests replace it).
var command = func() string { return os.Getenv("CNI_COMMAND") }

func isNonEmptyString(v any) bool {
	s, ok := v.(string)
	return ok && s != ""
}

// jsonValueKind names the JSON type of a value decoded into any.
func jsonValueKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	case string:
		return "a string"
	case bool:
		return "true or false"
	case float64:
		return "a number"
	}
	return fmt.Sprintf("%T", v)
}

func typeAccepted(t, pluginType string) bool {
	if t == pluginType {
		return true
	}
	self := filepath.Base(os.Args[0])
	return t != "" && t == self
}

// Unmarshal decodes JSON and maps decoding errors to CNI codes: input that is
// not JSON is code 6; JSON whose values do not fit the config is code 7 naming
// the field. prefix is prepended to field names (e.g. "ipam").
func Unmarshal(data []byte, v any, prefix string) error {
	if len(strings.TrimSpace(string(data))) == 0 {
		return cnierr.Decoding("empty config: expected a JSON object on stdin")
	}
	err := json.Unmarshal(data, v)
	if err == nil {
		return nil
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return cnierr.Decoding("config is not valid JSON: %v (at byte %d)", syn, syn.Offset)
	case errors.As(err, &typ):
		field := typ.Field
		if prefix != "" {
			field = joinField(prefix, field)
		}
		if field == "" {
			return cnierr.Config("expected a JSON %s, got %s", jsonKind(typ.Type.Kind().String()), typ.Value)
		}
		return cnierr.Field(field, "expected %s, got %s", jsonKind(typ.Type.Kind().String()), typ.Value)
	}
	var ce *types.Error
	if errors.As(err, &ce) {
		return ce
	}
	// Errors from custom UnmarshalJSON methods (addresses, CIDRs, durations).
	if prefix != "" {
		return cnierr.Field(prefix, "%v", err)
	}
	return cnierr.Config("%v", err)
}

func joinField(prefix, field string) string {
	if field == "" {
		return prefix
	}
	return prefix + "." + field
}

func jsonKind(goKind string) string {
	switch goKind {
	case "struct", "map":
		return "an object"
	case "slice", "array":
		return "a list"
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "an integer"
	case "float32", "float64":
		return "a number"
	}
	return goKind
}

// PrevResultCurrent returns the config's prevResult converted to the current result
// type, or nil when there is none.
func (b *Base) PrevResultCurrent() (*current.Result, error) {
	if b.PrevResult == nil {
		return nil, nil
	}
	r, err := current.NewResultFromResult(b.PrevResult)
	if err != nil {
		return nil, cnierr.Field("prevResult", "cannot convert to CNI %s: %v", current.ImplementedSpecVersion, err)
	}
	return r, nil
}

// RequirePrevResult is PrevResultCurrent for chained plugins that cannot work
// without one.
func (b *Base) RequirePrevResult() (*current.Result, error) {
	r, err := b.PrevResultCurrent()
	if err != nil {
		return nil, err
	}
	if r == nil {
		return nil, cnierr.Field("prevResult", "missing: this plugin must be chained after an interface plugin")
	}
	return r, nil
}
