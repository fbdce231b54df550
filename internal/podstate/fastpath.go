package podstate

import (
	"errors"
	"maps"
	"time"

	"github.com/meshwire/meshwire/ebpf/capture/pods"
	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/ebpf/loader"
	"github.com/meshwire/meshwire/internal/netns"
)

// The fast path's use of the records: the plugin writes a pod's policy
// (and the copy of its interception settings) into the fast path's maps
// at ADD when the fast path is attached (Apply), and a fast path attached
// later gets every pod's from the records (Replay). So a pod keeps its
// policy across a detach and an attach (the node agent's restart, a
// DaemonSet update) and gets it when the fast path is attached after the
// pod was created.

// Apply writes f's policy and copy, for the namespace of nsfs inode ino,
// into the fast path pinned at pinDir and reports whether it is attached
// there (when not, it does nothing). A fast path of an earlier build,
// with no maps for copies, gets the policy.
func (f Fastpath) Apply(pinDir string, ino uint64) (bool, error) {
	attached, err := podpolicy.Put(pinDir, f.Cookie, ino, f.Policy)
	if err != nil || !attached || f.Mirror == nil {
		return attached, err
	}
	err = pods.RegisterNS(loader.RulesDir(pinDir), f.Cookie, ino, *f.Mirror)
	if errors.Is(err, pods.ErrNotAttached) {
		err = nil
	}
	return true, err
}

// Replayed is what Replay did.
type Replayed struct {
	Pods    int // records written into the maps
	Dropped int // records of namespaces gone, removed
}

// recheck is how long Replay waits before it reads the namespaces a second
// time: a namespace that a runtime is passing from one holder to another
// (a sandbox starting) may be missed by one read.
const recheck = 100 * time.Millisecond

// Replay writes the fast-path section of every record into the maps of
// the fast path pinned at pinDir (Fastpath.Apply). With live
// (netns.Live), records of namespaces it does not list are removed
// instead, when a second read recheck later does not list them either (as
// the node agent's sweep drops nothing on one reading); where live cannot
// see every holder (netns.ErrPartialView) every record is written.
func (s Store) Replay(pinDir string, live func() (map[uint64]bool, error)) (Replayed, error) {
	var done Replayed
	all, err := s.List()
	if err != nil {
		return done, err
	}
	recs := map[string]Record{}
	for name, r := range all {
		if r.Fastpath != nil {
			recs[name] = r
		}
	}
	if len(recs) == 0 {
		return done, nil
	}
	alive, err := liveTwice(recs, live)
	if err != nil {
		return done, err
	}
	var errs []error
	absent := false
	for name, r := range recs {
		if alive != nil && !alive[r.NetnsIno] {
			errs = append(errs, s.forget(name, r.NetnsIno))
			done.Dropped++
			continue
		}
		if absent {
			continue
		}
		attached, err := r.Fastpath.Apply(pinDir, r.NetnsIno)
		switch {
		case err != nil:
			errs = append(errs, err)
		case !attached:
			absent = true // no fast path at pinDir: nothing to replay into
		default:
			done.Pods++
		}
	}
	return done, errors.Join(errs...)
}

// Restore readies the records for a fast path just attached at pinDir:
// it moves an earlier version's stores into them (Migrate: a node
// upgraded in place) and replays them (Replay). What it moved is
// reported with the replay's figures.
func (s Store) Restore(pinDir string, live func() (map[uint64]bool, error)) (Migrated, Replayed, error) {
	m, merr := s.Migrate()
	r, rerr := s.Replay(pinDir, live)
	return m, r, errors.Join(merr, rerr)
}

// liveTwice reads the live namespaces, and once more after recheck when a
// record's is missing: a namespace is absent only when neither read has
// it. nil (and no error) means every namespace counts as live.
func liveTwice(recs map[string]Record, live func() (map[uint64]bool, error)) (map[uint64]bool, error) {
	alive, err := live()
	for _, r := range recs {
		if err != nil || alive[r.NetnsIno] {
			continue
		}
		time.Sleep(recheck)
		var again map[uint64]bool
		if again, err = live(); err == nil {
			alive = maps.Clone(alive)
			if alive == nil {
				alive = map[uint64]bool{}
			}
			maps.Copy(alive, again)
		}
		break
	}
	if errors.Is(err, netns.ErrPartialView) {
		return nil, nil
	}
	return alive, err
}

// Stale returns the records (name -> nsfs inode) whose namespace live,
// called after the records were read, does not list: pods gone without a
// DEL, whose records the node agent's sweep collects (Forget) when two
// sweeps in a row find them so.
func (s Store) Stale(live func() (map[uint64]bool, error)) (map[string]uint64, error) {
	recs, err := s.List()
	if err != nil || len(recs) == 0 {
		return nil, err
	}
	alive, err := live()
	if err != nil {
		return nil, err
	}
	stale := map[string]uint64{}
	for name, r := range recs {
		if r.NetnsIno != 0 && !alive[r.NetnsIno] {
			stale[name] = r.NetnsIno
		}
	}
	return stale, nil
}

// Forget removes the record named name if its namespace is still the one
// of nsfs inode ino (a DEL and a new ADD of the same attachment may have
// replaced it meanwhile).
func (s Store) Forget(name string, ino uint64) error { return s.forget(name, ino) }

func (s Store) forget(name string, ino uint64) error {
	_, err := s.Update(name, false, func(r *Record) error {
		if r.NetnsIno == ino {
			*r = Record{} // empty: removed
		}
		return nil
	})
	if errors.Is(err, ErrGone) {
		return nil
	}
	return err
}
