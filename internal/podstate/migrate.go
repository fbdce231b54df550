package podstate

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"

	"github.com/meshwire/meshwire/ebpf/capture/pods"
	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/internal/ambient"
	"github.com/meshwire/meshwire/internal/recordfile"
)

// The stores of earlier versions, as they wrote them: one file per
// attachment, named as a record is (Name), in a directory of their own
// (nodelayout.Layout.Legacy).

// legacyCall is the intercept plugin's call (package meshedpods).
type legacyCall struct {
	ContainerID string `json:"containerID"`
	Netns       string `json:"netns"`
	IfName      string `json:"ifName"`
	Args        string `json:"args,omitempty"`
	Config      []byte `json:"config"`
	NetnsIno    uint64 `json:"netnsIno"`
	NetnsDev    uint64 `json:"netnsDev"`
}

// legacyFastpath is the intercept plugin's fast-path record (package
// podrecord).
type legacyFastpath struct {
	Netns    uint64           `json:"netns_cookie"`
	NetnsIno uint64           `json:"netns_ino"`
	Policy   podpolicy.Policy `json:"policy"`
	Mirror   *pods.Settings   `json:"mirror,omitempty"`
}

// legacyEnrolled is the node agent's enrolled pod (package ambientnode):
// the plugin's record of the pod's namespace, and the decision.
type legacyEnrolled struct {
	Pod        Record `json:"pod"`
	Enrollment struct {
		Why                 string
		Pod                 ambient.Overrides
		UID, ServiceAccount string
	} `json:"enrollment"`
	Backend string       `json:"backend"`
	IPs     []netip.Addr `json:"ips"`
}

// Migrated is what Migrate moved.
type Migrated struct {
	Calls, Fastpath, Enrolled int
	// Dropped are the enrolled pods of the earlier agent whose record was
	// gone (their DEL ran while no agent ran): nothing is kept of them;
	// the probe sets are filled again from the records (ambient mode's
	// host rule) and ztunnel's next snapshot leaves them out.
	Dropped int
}

// Any tells whether Migrate moved anything.
func (m Migrated) Any() bool { return m.Calls+m.Fastpath+m.Enrolled+m.Dropped > 0 }

// Migrate moves what the stores of earlier versions hold into the pods'
// records, once (what it moved it removes; a second run finds nothing): a
// node upgraded in place keeps its pods' drift repair, fast-path policies
// and ambient enrollments. Each file goes after its content is in the
// record, so that a Migrate killed midway moves the rest the next time;
// the files of writes cut short go with it. The node agent runs it when
// it starts, before it reads any record.
func (s Store) Migrate() (Migrated, error) {
	var m Migrated
	var errs []error
	l := s.Layout
	errs = append(errs, moveAll(s, l.LegacyCalls(), "the intercept calls", true, func(c legacyCall, r *Record) bool {
		r.identify(c.ContainerID, c.IfName, c.Netns, c.NetnsIno, c.NetnsDev)
		r.Call = &Call{Args: c.Args, Config: c.Config}
		if r.Network == "" {
			r.Network = networkOf(c.Config)
		}
		m.Calls++
		return true
	}, nil))
	errs = append(errs, moveAll(s, l.LegacyFastpath(), "the fast-path records", true, func(f legacyFastpath, r *Record) bool {
		if r.NetnsIno != 0 && r.NetnsIno != f.NetnsIno {
			return false // of an earlier namespace of the attachment
		}
		r.NetnsIno = f.NetnsIno
		r.Fastpath = &Fastpath{Cookie: f.Netns, Policy: f.Policy, Mirror: f.Mirror}
		m.Fastpath++
		return true
	}, nil))
	errs = append(errs, moveAll(s, l.LegacyEnrolled(), "the enrolled pods", false, func(e legacyEnrolled, r *Record) bool {
		if r.NetnsIno != e.Pod.NetnsIno {
			m.Dropped++
			return false
		}
		en := e.Enrollment
		r.Ambient = &Enrollment{Why: en.Why, Overrides: en.Pod, UID: en.UID, ServiceAccount: en.ServiceAccount, Backend: e.Backend, IPs: e.IPs}
		m.Enrolled++
		return true
	}, func() { m.Dropped++ }))
	for _, d := range l.Legacy() {
		_ = os.Remove(d) // when empty; a DaemonSet's mount of it stays
	}
	return m, errors.Join(errs...)
}

// moveAll merges every record of type T under dir into the pods' records
// and removes it: merge says whether it changed the record; a record that
// is not there is made when create, else gone is called.
func moveAll[T any](s Store, dir, what string, create bool, merge func(T, *Record) bool, gone func()) error {
	recs, bad, err := recordfile.ReadAll[T](dir, what)
	if err != nil {
		return err
	}
	var errs []error
	for _, name := range bad {
		errs = append(errs, recordfile.Remove(dir, name, what))
	}
	for name, v := range recs {
		if ValidName(name) != nil {
			errs = append(errs, recordfile.Remove(dir, name, what))
			continue
		}
		_, err := s.Update(name, create, func(r *Record) error {
			if !merge(v, r) {
				return errUnchanged
			}
			return nil
		})
		switch {
		case errors.Is(err, ErrGone):
			gone()
		case err != nil && !errors.Is(err, errUnchanged):
			errs = append(errs, err)
			continue
		}
		errs = append(errs, recordfile.Remove(dir, name, what))
	}
	return errors.Join(errs...)
}

// errUnchanged ends an Update that has nothing to write.
var errUnchanged = errors.New("unchanged")

// identify fills the attachment's names and namespace when r has none.
func (r *Record) identify(id, ifName, path string, ino, dev uint64) {
	if r.ContainerID == "" {
		r.ContainerID, r.IfName = id, ifName
	}
	if r.Netns == "" {
		r.Netns, r.NetnsIno, r.NetnsDev = path, ino, dev
	}
}

// networkOf is the network name of a plugin config.
func networkOf(config []byte) string {
	var c struct {
		Name string `json:"name"`
	}
	_ = json.Unmarshal(config, &c)
	return c.Name
}
