package podveth

import (
	"log/slog"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/killpoint"
)

// Steps logs, at debug level, how long each step of a command took since
// the previous one: where the time of an ADD or DEL goes.
type Steps struct{ last time.Time }

// newSteps starts the clock.
func newSteps() *Steps { return &Steps{last: time.Now()} }

// Mark logs the step that just ended; it is also a kill point of the crash
// tests (killpoint).
func (s *Steps) Mark(step string) {
	now := time.Now()
	logStep(step, now.Sub(s.last))
	s.last = now
	killpoint.Here(step)
}

// timed runs fn and logs its duration as step: for steps that run side by
// side, which Steps cannot time.
func timed(step string, fn func() error) error {
	start := time.Now()
	err := fn()
	logStep(step, time.Since(start))
	killpoint.Here(step)
	return err
}

func logStep(step string, d time.Duration) {
	slog.Debug("step", "step", step, "ms", float64(d.Microseconds())/1000)
}

// joinErrors reports the failures of steps that ran side by side as one CNI
// error: the code of the first failure (so a "try again" or the IPAM
// plugin's own code reaches the runtime) and every message.
func joinErrors(errs ...error) error {
	var failed []error
	for _, e := range errs {
		if e != nil {
			failed = append(failed, e)
		}
	}
	switch len(failed) {
	case 0:
		return nil
	case 1:
		return failed[0]
	}
	msgs := make([]string, len(failed))
	for i, e := range failed {
		msgs[i] = e.Error()
	}
	return types.NewError(cnierr.Code(failed[0]), strings.Join(msgs, "; "), "")
}
