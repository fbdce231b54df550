// Package podrecord keeps, on the node, what the chained intercept plugin
// decided for each meshed pod about the fast path: its policy and the copy
// of its interception settings, under its network namespace's cookie. The
// plugin writes a record at ADD (whether the fast path is attached or not)
// and removes it at DEL; attach replays the records into the new maps. So
// a pod keeps its policy across a detach and an attach (the node agent's
// restart, a DaemonSet update) and gets it when the fast path is attached
// after the pod was created.
//
// A record names the namespace by cookie (never handed out twice: a record
// of a gone namespace writes entries no socket will ever match) and by its
// nsfs inode, by which a replay that can see every namespace holder
// (netns.Live) drops records of namespaces that went without a DEL.
package podrecord

import (
	"errors"
	"maps"
	"time"

	"github.com/meshwire/meshwire/ebpf/capture/pods"
	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/ebpf/loader"
	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/recordfile"
)

// Dir is where the records are kept: beside the other plugins' state in
// /var/lib/cni, which the node agent's DaemonSet mounts.
const Dir = "/var/lib/cni/meshwire/fastpath"

// Record is one pod's.
type Record struct {
	Netns    uint64           `json:"netns_cookie"`
	NetnsIno uint64           `json:"netns_ino"`
	Policy   podpolicy.Policy `json:"policy"`
	// Mirror is the copy of its interception settings (apply.MirrorOf in internal/intercept/apply);
	// nil when the rules are not the plugin's (an init container's).
	Mirror *pods.Settings `json:"mirror,omitempty"`
}

// Name is a record's file name for the attachment of container id on
// interface ifName (recordfile.Name).
func Name(id, ifName string) string { return recordfile.Name(id, ifName) }

const what = "the pod's fast-path record"

// Write keeps r as name under dir (Dir when empty), whole or not at all.
func Write(dir, name string, r Record) error {
	return recordfile.Write(dirOf(dir), name, what, r)
}

// Remove removes record name, and what a write of it cut short left;
// none is not an error.
func Remove(dir, name string) error {
	return recordfile.Remove(dirOf(dir), name, what)
}

func dirOf(dir string) string {
	if dir == "" {
		return Dir
	}
	return dir
}

// Replayed is what Replay did.
type Replayed struct {
	Pods    int // records written into the maps
	Dropped int // records of namespaces gone, removed
}

// Apply writes r's policy and copy into the fast path pinned at pinDir
// and reports whether it is attached there (when not, it does nothing). A
// fast path of an earlier build, with no maps for copies, gets the policy.
func Apply(pinDir string, r Record) (bool, error) {
	attached, err := podpolicy.Put(pinDir, r.Netns, r.NetnsIno, r.Policy)
	if err != nil || !attached || r.Mirror == nil {
		return attached, err
	}
	err = pods.RegisterNS(loader.RulesDir(pinDir), r.Netns, r.NetnsIno, *r.Mirror)
	if errors.Is(err, pods.ErrNotAttached) {
		err = nil
	}
	return true, err
}

// recheck is how long Replay waits before it reads the namespaces a second
// time: a namespace that a runtime is passing from one holder to another
// (a sandbox starting) may be missed by one read.
const recheck = 100 * time.Millisecond

// Replay writes every record under dir (Dir when empty) into the maps of
// the fast path pinned at pinDir (Apply). With live (netns.Live), records
// of namespaces it does not list are removed instead, when a second read
// recheck later does not list them either (as the node agent's sweep
// drops nothing on one reading); where live cannot see every holder
// (netns.ErrPartialView) every record is written. A file that cannot be
// read as a record is removed (a write cut short leaves only a temporary
// file, which goes too).
func Replay(dir, pinDir string, live func() (map[uint64]bool, error)) (Replayed, error) {
	var done Replayed
	recs, bad, err := read(dir)
	if err != nil {
		return done, err
	}
	var errs []error
	for _, name := range bad {
		errs = append(errs, Remove(dir, name))
	}
	if len(recs) == 0 {
		return done, errors.Join(errs...)
	}
	alive, err := liveTwice(recs, live)
	if err != nil {
		return done, errors.Join(append(errs, err)...)
	}
	absent := false
	for name, r := range recs {
		if alive != nil && !alive[r.NetnsIno] {
			errs = append(errs, Remove(dir, name))
			done.Dropped++
			continue
		}
		if absent {
			continue
		}
		attached, err := Apply(pinDir, r)
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

// read reads every record under dir: file name -> record, and the names
// of the files that are not records (temporary files of a write cut
// short, unreadable ones).
func read(dir string) (recs map[string]Record, bad []string, err error) {
	return recordfile.ReadAll[Record](dirOf(dir), "the fast-path records")
}

// Stale returns the records (namespace cookie -> nsfs inode) whose
// namespace live, called after the records were read, does not list: pods
// gone without a DEL, as pods.Stale finds registrations.
func Stale(dir string, live func() (map[uint64]bool, error)) (map[uint64]uint64, error) {
	recs, _, err := read(dir)
	if err != nil || len(recs) == 0 {
		return nil, err
	}
	alive, err := live()
	if err != nil {
		return nil, err
	}
	stale := map[uint64]uint64{}
	for _, r := range recs {
		if !alive[r.NetnsIno] {
			stale[r.Netns] = r.NetnsIno
		}
	}
	return stale, nil
}

// ForgetStale removes the records of namespace cookie ns that still have
// nsfs inode ino.
func ForgetStale(dir string, ns, ino uint64) error {
	recs, _, err := read(dir)
	if err != nil {
		return err
	}
	for name, r := range recs {
		if r.Netns == ns && r.NetnsIno == ino {
			if err := Remove(dir, name); err != nil {
				return err
			}
		}
	}
	return nil
}
