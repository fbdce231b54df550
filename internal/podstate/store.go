package podstate

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/filelock"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/recordfile"
)

// Store is the records of one layout.
type Store struct {
	// Layout is where the records are (Layout.Pods) and where the stores
	// of earlier versions were (Migrate).
	Layout nodelayout.Layout
}

// New is the store of layout l.
func New(l nodelayout.Layout) Store { return Store{Layout: l} }

// Default is the store of the layout the environment names
// (nodelayout.FromEnv): the plugin's, and the commands' that run it.
func Default() Store { return New(nodelayout.FromEnv()) }

// Dir is the records' directory.
func (s Store) Dir() string { return s.Layout.Pods() }

const what = "the pod's record"

// ErrGone: the pod's record is not there (its DEL ran, or no ADD wrote
// it).
var ErrGone = errors.New("the pod's record is gone (its DEL ran)")

// ErrNotThePod: the record's namespace path no longer leads to the pod's
// namespace (netns.ErrNotThePod).
var ErrNotThePod = netns.ErrNotThePod

// lockTimeout bounds the wait for the records' lock, which each write
// holds for one read and one rename: a holder stuck past it ends in CNI
// code 11.
const lockTimeout = filelock.DefaultTimeout

// dir creates the records' directory (root's alone) and returns it.
func (s Store) dir() (string, error) {
	d := s.Dir()
	if err := os.MkdirAll(d, nodelayout.DirMode); err != nil {
		return "", fmt.Errorf("create the directory of the pods' records: %w", err)
	}
	// An earlier version made it with the umask's mode.
	if err := os.Chmod(d, nodelayout.DirMode); err != nil {
		return "", fmt.Errorf("the directory of the pods' records: %w", err)
	}
	return d, nil
}

// locked runs fn holding the records' lock (an flock on their directory):
// writes and removals of records never overlap, so that a write that
// reads a record and writes it back loses no other's change, and never
// brings back a record a DEL removed.
func (s Store) locked(fn func(dir string) error) error {
	d, err := s.dir()
	if err != nil {
		return err
	}
	l, err := filelock.AcquireDir(d, lockTimeout)
	if err != nil {
		return err
	}
	defer l.Release()
	return fn(d)
}

// Read returns the record named name, or ok false when there is none.
// A name that is not one path element is an error.
func (s Store) Read(name string) (r Record, ok bool, err error) {
	if err := ValidName(name); err != nil {
		return Record{}, false, err
	}
	return read(filepath.Join(s.Dir(), name))
}

func read(path string) (r Record, ok bool, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Record{}, false, nil
	}
	if err == nil {
		err = json.Unmarshal(b, &r)
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("read %s %s: %w", what, filepath.Base(path), err)
	}
	return r, true, nil
}

// List returns every record, by name. Files that are not records (a
// write in progress, or cut short: its DEL removes it) are left out.
func (s Store) List() (map[string]Record, error) {
	recs, _, err := recordfile.ReadAll[Record](s.Dir(), "the pods' records")
	return recs, err
}

// Update changes the record named name with change, holding the records'
// lock, and writes it back whole; it returns the record written. A
// record that is not there starts from its zero value when create,
// else Update returns ErrGone (a DEL ran: what the caller did for the pod
// is not recorded for a pod that is gone). change may return an error,
// which Update returns without writing; a record change leaves empty
// (Record.Empty) is removed.
func (s Store) Update(name string, create bool, change func(*Record) error) (Record, error) {
	if err := ValidName(name); err != nil {
		return Record{}, err
	}
	var out Record
	err := s.locked(func(dir string) error {
		r, ok, err := read(filepath.Join(dir, name))
		if err != nil {
			return err
		}
		if !ok && !create {
			return ErrGone
		}
		if err := change(&r); err != nil {
			return err
		}
		out = r
		if r.Empty() {
			return recordfile.Remove(dir, name, what)
		}
		return recordfile.Write(dir, name, what, r)
	})
	return out, err
}

// Put writes r as its attachment's record (Record.File), in place of
// any; the enrollment of a record of the same namespace stays when r has
// none (the node agent's, which a repeated ADD of the pod knows nothing
// of).
func (s Store) Put(r Record) error {
	_, err := s.Update(r.File(), true, func(old *Record) error {
		if r.Ambient == nil && old.Ambient != nil && old.NetnsIno == r.NetnsIno && old.NetnsDev == r.NetnsDev {
			r.Ambient = old.Ambient
		}
		*old = r
		return nil
	})
	return err
}

// Remove removes the record named name, and what a write of it cut short
// left, once a repair of the pod is done (LockForRepair; waiting at most
// repairWait, then removing it anyway: a DEL always finishes). None is
// not an error.
func (s Store) Remove(name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	if f, err := lockFile(filepath.Join(s.Dir(), name)); err == nil {
		defer f.Close()
	}
	return s.locked(func(dir string) error { return recordfile.Remove(dir, name, what) })
}

// RemoveLegacy removes what the stores of earlier versions hold of the
// attachment record name names (nodelayout.Layout.Legacy): the DEL of a
// pod an earlier plugin added, on a node whose agent has not moved them
// yet (Migrate). It waits for a repair by an earlier agent, as Remove
// does.
func (s Store) RemoveLegacy(name string) error {
	if err := ValidName(name); err != nil {
		return err
	}
	var errs []error
	for _, dir := range s.Layout.Legacy() {
		if f, err := lockFile(filepath.Join(dir, name)); err == nil {
			defer f.Close()
		}
		errs = append(errs, recordfile.Remove(dir, name, "what an earlier version recorded of the pod"))
	}
	return errors.Join(errs...)
}

// Exists tells whether the record named name is there.
func (s Store) Exists(name string) bool { return recordfile.Exists(s.Dir(), name) }

// repairWait bounds how long a DEL waits for a repair of its pod (the
// node agent kills a repair after 30 s).
const repairWait = 35 * time.Second

// Repairing tells whether this process is an ADD the node agent repeats
// (nodelayout.EnvRepair).
func Repairing() bool { return os.Getenv(nodelayout.EnvRepair) == "1" }

// LockForRepair holds the record named name for a repair ADD, until
// release: the pod's DEL waits for it (Remove), so that what the repair
// installs is what the DEL then removes. It returns the record, ErrGone
// when the DEL ran, or ErrNotThePod. A repair writes no record: the lock
// is on the record's file, which a write would replace.
func (s Store) LockForRepair(name string) (r Record, release func(), err error) {
	if err := ValidName(name); err != nil {
		return Record{}, nil, err
	}
	path := filepath.Join(s.Dir(), name)
	f, err := lockFile(path)
	if err != nil {
		return Record{}, nil, err
	}
	release = func() { _ = f.Close() }
	r, ok, err := read(path)
	switch {
	case err != nil:
	case !ok:
		err = ErrGone // removed while this waited
	case r.Call == nil:
		err = ErrGone // not a call the agent repeats
	default:
		err = r.Check()
	}
	if err != nil {
		release()
		return Record{}, nil, err
	}
	return r, release, nil
}

// lockFile opens path and takes an exclusive flock on it, waiting at most
// repairWait; ErrGone when there is no file.
func lockFile(path string) (*os.File, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrGone
	}
	if err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(repairWait); ; {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
