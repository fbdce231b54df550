// Package undo records the steps of a multi-step operation so that a
// failure part way undoes, in reverse order, everything done so far (an
// interface plugin's ADD: IPAM, links, firewall rules).
package undo

// Stack is a list of undo steps; the zero value is ready to use.
type Stack struct{ steps []func() }

// Push records a step's undo.
func (s *Stack) Push(fn func()) { s.steps = append(s.steps, fn) }

// Run undoes every recorded step, last first, and forgets them.
func (s *Stack) Run() {
	for i := len(s.steps) - 1; i >= 0; i-- {
		s.steps[i]()
	}
	s.steps = nil
}
