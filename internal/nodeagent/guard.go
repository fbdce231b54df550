package nodeagent

import (
	"fmt"
	"log/slog"
	"runtime/debug"
)

// guard runs fn, one round of the agent's background work (a reconcile,
// the meshed pods' checks), and turns a panic in it into an error record
// of the agent's log with its stack: the round is lost, the agent goes on
// and the next round runs. It reports whether fn panicked.
func guard(what string, fn func()) (panicked bool) {
	defer func() {
		if v := recover(); v != nil {
			panicked = true
			slog.Error("panic in "+what+"; the next round runs", "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
		}
	}()
	fn()
	return false
}
