package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/meshwire/meshwire/internal/cnierr"
)

// The reference plugin's allocations on a node upgraded in place (see
// the package comment): its files imported as taken addresses, read
// again only when the directory changed, and removed with their owner.

// removeReferenceFiles runs inside the commit: removing first means that a
// crash before the commit leaves the database entry of a file that is gone,
// which the next import drops (the directory changed). After removing, the
// new modification time is recorded when the directory was in step before.
func (s *Store) removeReferenceFiles(t *Tx) error {
	if len(t.files) == 0 {
		return nil
	}
	before, err := dirMtime(s.dir)
	if err != nil {
		return err
	}
	inStep := t.recordedMtime() == before
	for _, name := range t.files {
		if err := os.Remove(filepath.Join(s.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove reference allocation file: %v", err)
		}
	}
	if !inStep {
		return nil // the next command imports anyway
	}
	after, err := dirMtime(s.dir)
	if err != nil {
		return err
	}
	return t.recordMtime(after)
}

func (t *Tx) recordedMtime() int64 {
	v := t.meta.Get(keyDirMtime)
	if len(v) != 8 {
		return 0
	}
	return int64(binary.BigEndian.Uint64(v))
}

// recordMtime stores the directory's modification time, first waiting
// until the file system clock has moved past it (we hold the lock, so no
// other host-local changes the directory meanwhile).
func (t *Tx) recordMtime(m int64) error {
	if wait := time.Until(time.Unix(0, m).Add(settle)); wait > 0 {
		time.Sleep(wait)
	}
	return t.meta.Put(keyDirMtime, binary.BigEndian.AppendUint64(nil, uint64(m)))
}

func dirMtime(dir string) (int64, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		return 0, fmt.Errorf("stat %s: %v", dir, err)
	}
	return fi.ModTime().UnixNano(), nil
}

// syncReference imports the reference's files when the directory changed
// since the last import.
func (s *Store) syncReference() error {
	m, err := dirMtime(s.dir)
	if err != nil {
		return cnierr.Internal("%v", err)
	}
	var recorded int64
	_ = s.View(func(t *Tx) error { recorded = t.recordedMtime(); return nil })
	if recorded == m {
		return nil
	}
	return s.Update(func(t *Tx) error { return t.importReference(s.dir, m) })
}

// ReadReferenceFile parses a reference allocation file's content.
func ReadReferenceFile(data []byte) Owner {
	c := strings.TrimSpace(string(data))
	id, ifname, _ := strings.Cut(c, LineBreak)
	return Owner{ID: strings.TrimSpace(id), IfName: ifname}
}

// importReference makes the legacy allocations in the database exactly the
// reference files present in dir; m is the directory's modification time
// taken before reading it.
func (t *Tx) importReference(dir string, m int64) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("read %s: %v", dir, err)
	}
	present := map[string]bool{}
	var adds []Allocation
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, LastReservedPrefix) {
			t.importLastReserved(dir, name)
			continue
		}
		a := net.ParseIP(name)
		if a == nil || !e.Type().IsRegular() {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			continue // removed meanwhile by a reference plugin not honouring the lock
		}
		present[string(key(a))] = true
		if v := t.ips.Get(key(a)); v != nil {
			if cur, err := decode(key(a), v); err == nil && !cur.Legacy {
				// A reference plugin that ran after meshwire took over
				// handed out an address meshwire holds: meshwire's
				// allocation stands; the operator must see the clash.
				slog.Warn("reference allocation file names an address meshwire holds", "ip", a.String(), "file", ReadReferenceFile(data), "holder", cur.Owner)
			}
			continue
		}
		adds = append(adds, Allocation{IP: fromKey(key(a)), Owner: ReadReferenceFile(data), RangeSet: -1, Legacy: true})
	}
	if err := t.reserveMany(adds); err != nil {
		return err
	}
	// Legacy entries whose file is gone were released by a reference plugin.
	var gone []Allocation
	err = t.ForEach(func(a Allocation) error {
		if a.Legacy && !present[string(key(a.IP))] {
			gone = append(gone, a)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, a := range gone {
		a.Legacy = false // the file is already gone
		if err := t.Release(a); err != nil {
			return err
		}
	}
	return t.recordMtime(m)
}

// importLastReserved seeds the round-robin position of a range set from
// the reference's file, when meshwire has none yet.
func (t *Tx) importLastReserved(dir, name string) {
	n, err := strconv.Atoi(strings.TrimPrefix(name, LastReservedPrefix))
	if err != nil || n < 0 || t.LastReserved(n) != nil {
		return
	}
	data, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		return
	}
	if a := net.ParseIP(strings.TrimSpace(string(data))); a != nil {
		_ = t.SetLastReserved(n, a)
	}
}
