// Package poll waits for a condition the code cannot be told about, by
// asking it again every few milliseconds until a deadline: what a test
// waits for from another process (an agent's socket, a proxy's log), and
// `meshwire demo` for its ztunnel stand-in.
package poll

import (
	"fmt"
	"time"
)

// Interval is how long Until sleeps between two asks.
const Interval = 20 * time.Millisecond

// Until asks cond until it is true, and returns nil then; it returns an
// error naming timeout when cond is still false after it.
func Until(timeout time.Duration, cond func() bool) error {
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(Interval) {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", timeout)
		}
	}
	return nil
}
