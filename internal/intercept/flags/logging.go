package flags

import (
	"fmt"
	"strconv"
	"strings"
)

// Level is a message level, as Istio's logging names them.
type Level int

const (
	LevelDebug Level = iota
	LevelInfo
	LevelWarn
	LevelError
	LevelFatal
	LevelNone
)

var levelNames = []string{"debug", "info", "warn", "error", "fatal", "none"}

func (l Level) String() string { return levelNames[l] }

// Log is how the command reports (istio's --log_* flags).
type Log struct {
	Level   Level    // messages below it are not shown
	JSON    bool     // one JSON object per message
	Targets []string // "stdout", "stderr" or file paths; none: stderr
}

// Scopes whose level applies to iptables-init's messages: Istio's default
// scope, and "all", which sets every scope.
const (
	scopeDefault = "default"
	scopeAll     = "all"
)

// logging reads --log_output_level, --log_as_json and --log_target, and
// checks the flags that have no effect here as Istio would.
func (p *parser) logging() error {
	var err error
	if p.o.Log.Level, err = scopedLevel(p.str("log_output_level"), LevelInfo); err != nil {
		return p.bad("log_output_level", "%v", err)
	}
	if _, err := scopedLevel(p.str("log_stacktrace_level"), LevelNone); err != nil {
		return p.bad("log_stacktrace_level", "%v", err)
	}
	if _, err := strconv.ParseInt(p.str("vklog"), 10, 32); err != nil {
		return p.bad("vklog", "%q is not a verbosity level (want a number)", p.str("vklog"))
	}
	for _, t := range *p.lists["log_target"] {
		if strings.TrimSpace(t) == "" {
			return p.bad("log_target", "empty target (want stdout, stderr or a file path)")
		}
		p.o.Log.Targets = append(p.o.Log.Targets, strings.TrimSpace(t))
	}
	p.o.Log.JSON = p.bool("log_as_json")
	return nil
}

// scopedLevel reads Istio's "[scope:]level,..." and returns the level of
// the default scope (def unless given). Other scopes are accepted and
// ignored, as Istio ignores scopes it does not have.
func scopedLevel(s string, def Level) (Level, error) {
	level := def
	for _, item := range splitList(s) {
		scope, name := scopeDefault, item
		if parts := strings.Split(item, ":"); len(parts) == 2 {
			scope, name = parts[0], parts[1]
		} else if len(parts) > 2 {
			return def, fmt.Errorf("%q is not scope:level", item)
		}
		l, ok := parseLevel(name)
		if !ok {
			return def, fmt.Errorf("%q is not a level (want one of %s)", name, strings.Join(levelNames, ", "))
		}
		if scope == scopeDefault || scope == scopeAll {
			level = l
		}
	}
	return level, nil
}

func parseLevel(name string) (Level, bool) {
	for i, n := range levelNames {
		if n == name {
			return Level(i), true
		}
	}
	return 0, false
}
