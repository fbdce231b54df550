// Package ipamexec delegates addressing to the IPAM plugin named in a
// config's "ipam.type", found on CNI_PATH, for every CNI command, keeping
// the IPAM plugin's error codes and naming it in the messages.
package ipamexec

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/meshwire/meshwire/internal/cnierr"
)

// Timeout bounds one IPAM call.
const Timeout = 60 * time.Second

func find(typ string) error {
	_, err := invoke.FindInPath(typ, filepath.SplitList(os.Getenv("CNI_PATH")))
	return err
}

func wrap(typ, cmd string, err error) error {
	if err == nil {
		return nil
	}
	return cnierr.Wrap(err, "ipam %q %s", typ, cmd)
}

// Add runs IPAM ADD and converts the result to the current spec version. It
// also returns release, which runs IPAM DEL: the caller's rollback when a
// later step of its ADD fails.
func Add(ctx context.Context, typ string, stdin []byte) (*current.Result, func(), error) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	r, err := invoke.DelegateAdd(ctx, typ, stdin, nil)
	if err != nil {
		return nil, nil, wrap(typ, "ADD", err)
	}
	release := func() {
		if err := Del(context.Background(), typ, stdin); err != nil {
			slog.Warn("rollback: IPAM DEL failed", "ipam", typ, "error", err)
		}
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		release()
		return nil, nil, cnierr.Internal("ipam %q ADD: cannot convert its result: %v", typ, err)
	}
	if len(res.IPs) == 0 {
		release()
		return nil, nil, cnierr.Internal("ipam %q ADD returned no IP address", typ)
	}
	return res, release, nil
}

// call runs one IPAM command without result, bounded by Timeout, and
// names the plugin and command in its error.
func call(ctx context.Context, typ, cmd string, fn func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	return wrap(typ, cmd, fn(ctx))
}

// Del runs IPAM DEL.
func Del(ctx context.Context, typ string, stdin []byte) error {
	return call(ctx, typ, "DEL", func(ctx context.Context) error { return invoke.DelegateDel(ctx, typ, stdin, nil) })
}

// Check runs IPAM CHECK.
func Check(ctx context.Context, typ string, stdin []byte) error {
	return call(ctx, typ, "CHECK", func(ctx context.Context) error { return invoke.DelegateCheck(ctx, typ, stdin, nil) })
}

// Status runs IPAM STATUS. An IPAM plugin that cannot be found makes the
// network not available (code 50).
func Status(ctx context.Context, typ string, stdin []byte) error {
	if err := find(typ); err != nil {
		return cnierr.NotAvailable("ipam plugin %q not found on CNI_PATH: %v", typ, err)
	}
	return call(ctx, typ, "STATUS", func(ctx context.Context) error { return invoke.DelegateStatus(ctx, typ, stdin, nil) })
}

// GC runs IPAM GC (the config carries cni.dev/valid-attachments).
func GC(ctx context.Context, typ string, stdin []byte) error {
	return call(ctx, typ, "GC", func(ctx context.Context) error { return invoke.DelegateGC(ctx, typ, stdin, nil) })
}

// Pending is an IPAM ADD running in the background while the caller builds
// the links (the two do not depend on each other).
type Pending struct {
	done    chan struct{}
	res     *current.Result
	release func()
	err     error
}

// Start runs IPAM ADD in the background.
func Start(ctx context.Context, typ string, stdin []byte) *Pending {
	p := &Pending{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.res, p.release, p.err = Add(ctx, typ, stdin)
	}()
	return p
}

// Wait returns the IPAM result.
func (p *Pending) Wait() (*current.Result, error) {
	<-p.done
	return p.res, p.err
}

// Release waits for the ADD and undoes it when it succeeded.
func (p *Pending) Release() {
	<-p.done
	if p.release != nil {
		p.release()
		p.release = nil
	}
}
