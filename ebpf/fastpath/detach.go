package fastpath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"

	"github.com/meshwire/meshwire/ebpf/loader"
)

// Detached is what Detach did.
type Detached struct {
	WasAttached bool
	// Live counts the sockets still on the fast path: they keep it until
	// they close.
	Live int
}

// Detach stops the fast path at dir: new messages go on TCP, no new socket
// is taken, the sockops attachment and every pin are removed.
func Detach(dir string) (Detached, error) {
	if dir == "" {
		dir = DefaultPinDir
	}
	if _, err := os.Stat(loader.LockDir); errors.Is(err, os.ErrNotExist) {
		return Detached{}, nil // no bpffs mount point: nothing was ever pinned
	}
	l, err := loader.Lock()
	if err != nil {
		return Detached{}, err
	}
	defer l.Release()
	return detach(dir)
}

// detach is Detach with the lock held.
func detach(dir string) (Detached, error) {
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		return Detached{}, nil
	}
	d := Detached{WasAttached: true}
	var socks *ebpf.Map
	defer func() {
		if socks != nil {
			socks.Close()
		}
	}()
	if ctl, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinControl), nil); err == nil {
		var c bpfControl
		if ctl.Lookup(uint32(0), &c) == nil {
			c.Draining = 1
			err = ctl.Put(uint32(0), c)
		}
		ctl.Close()
		if err != nil {
			return d, fmt.Errorf("set the fast path draining: %w", err)
		}
		socks, _ = ebpf.LoadPinnedMap(filepath.Join(dir, pinSocks), nil)
	}
	// Removing the link's pin releases the sockops attachment (nothing
	// else holds the link); removing the maps' pins leaves them to the
	// programs that use them, the sk_msg program held by each socket
	// still on the fast path.
	if err := loader.RemovePins(dir); err != nil {
		return d, err
	}
	if socks == nil {
		return d, nil
	}
	live, err := CountSockets(socks)
	d.Live = live
	return d, err
}
