package netns

import (
	"errors"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/meshwire/meshwire/internal/cnierr"
)

// Gone is the error Enter returns when the namespace cannot be entered at
// all (it does not exist, is not a namespace, or setns refuses it): DEL
// treats that as "already cleaned up".
type Gone struct{ Err error }

func (g *Gone) Error() string { return g.Err.Error() }
func (g *Gone) Unwrap() error { return g.Err }

// IsGone reports whether err says the namespace could not be entered.
func IsGone(err error) bool {
	var g *Gone
	return errors.As(err, &g)
}

// Enter runs fn with the calling thread inside the namespace at path (the
// CNI_NETNS of a plugin call). Failure to enter is a CNI error (code 4,
// naming CNI_NETNS) that also satisfies IsGone; fn's own errors are returned
// unchanged.
func Enter(path string, fn func() error) error {
	netNS, err := ns.GetNS(path)
	if err != nil {
		return errors.Join(cnierr.InvalidEnv("CNI_NETNS", "%v", err), &Gone{err})
	}
	defer netNS.Close()
	entered := false
	err = netNS.Do(func(ns.NetNS) error {
		entered = true
		return fn()
	})
	if err != nil && !entered {
		return errors.Join(cnierr.InvalidEnv("CNI_NETNS", "%v", err), &Gone{err})
	}
	return err
}
