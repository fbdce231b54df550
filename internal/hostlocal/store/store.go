// Package store keeps host-local's allocations on the node.
//
// # Design
//
// The reference host-local writes one file per address and, on every ADD,
// reads every file of the network's directory to find the container's
// existing addresses, so ADD costs O(allocated). meshwire keeps the
// allocations of a network in one bbolt database (a B+tree in a single
// memory-mapped file, go.etcd.io/bbolt, the store etcd and containerd use)
// in the same directory, dataDir/<network>/meshwire-host-local.db:
//
//   - bucket "ips": key = 16-byte address, value = owner (container id,
//     interface name), range set index and whether it came from a reference
//     file. "Is this address taken" is one B+tree lookup; the round-robin
//     walk over consecutive addresses reuses one cursor.
//   - bucket "owners": key = id NUL ifname NUL address. "What does this
//     container hold" is a prefix seek, so DEL, CHECK and the duplicate ADD
//     check never scan.
//   - bucket "meta": last reserved address per range set (round-robin), and
//     the modification time of the directory when reference files were last
//     read.
//   - bucket "since": key = 16-byte address, value = when it was allocated
//     (8 bytes, Unix nanoseconds, big-endian) followed by its owner (id NUL
//     ifname NUL). A GC against a runtime's sandbox list keeps what was
//     allocated after a cutoff: an ADD still under way is in no list
//     (`meshwire gc --cri-socket`). The bucket is created by the first
//     write of a version that has it; an allocation without an entry (made
//     by an earlier version, or imported from reference files), or whose
//     entry names another owner (an earlier version released the address
//     and gave it again), has no known time.
//
// Why a B+tree file rather than files, a log or a hand-made index:
// opening costs O(1) (mmap, read the two meta pages; no replay, unlike a log),
// each lookup is O(log n) touching a few pages, and a commit writes only the
// changed pages. bbolt commits are atomic and durable: pages are written
// copy-on-write, fdatasync'd, then one of two checksummed meta pages is
// switched and fdatasync'd, so a process killed at any instant (or a power
// loss) leaves either the old or the new state, never a half-written one.
// All changes of one CNI command (all range sets of an ADD, all addresses of
// a DEL or GC) are one transaction: a failed or interrupted ADD allocates
// nothing. The database is created under a temporary name and renamed into
// place, so even a crash during its creation leaves nothing half-made.
//
// # Locking
//
// Every command holds an flock on dataDir/<network>/lock, the same file the
// reference plugin locks, so the two binaries exclude each other on a node
// in the middle of an upgrade. The lock dies with its process (kill -9
// leaves no stale lock) and is taken with a bound: past it the command
// fails with CNI code 11 (try again later). Waiters queue in the kernel
// (filelock.AcquireQueued) rather than poll, so with hundreds of concurrent
// ADD and DEL the lock passes from one process to the next without idle
// gaps.
//
// # Nodes upgraded from the reference plugin
//
// Files named by an address in the network's directory (content
// "containerid\r\nifname", or just "containerid" from older versions) are
// allocations of the reference. They are imported as taken addresses owned
// by that container, and DEL or GC of the owner removes the file too. The
// directory is read again only when its modification time differs from the
// one recorded at the last import (meshwire itself changes the directory
// only when it creates the database or removes a reference file, and then
// records the new time), so a node with no reference files pays one stat per
// command. A modification time is recorded only once the coarse file system
// clock has moved past it, so that a change within the same clock tick
// cannot go unnoticed. The reference's last_reserved_ip.N files seed the
// round-robin position. meshwire does not write reference files (each would
// change the directory and cost the next command a re-read): a downgrade
// keeps the reference's own allocations but not meshwire's, and a reference
// process still running after the binary was replaced does not see
// meshwire's allocations (the shared lock keeps their changes apart, but it
// could pick an address meshwire holds; such a clash is logged and
// meshwire's allocation stands).
package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/filelock"
)

const (
	// DBName is the database file in dataDir/<network>/.
	DBName = "meshwire-host-local.db"
	// LockName is the lock file, shared with the reference plugin.
	LockName = "lock"
	// LineBreak separates container id and interface in reference files.
	LineBreak = "\r\n"
	// LastReservedPrefix names the reference's round-robin files.
	LastReservedPrefix = "last_reserved_ip."
	// settle is how long after a directory change its modification time is
	// trusted: longer than the coarse kernel clock tick that stamps it.
	settle = 25 * time.Millisecond
)

var (
	bucketIPs    = []byte("ips")
	bucketOwners = []byte("owners")
	bucketMeta   = []byte("meta")
	bucketSince  = []byte("since")
	keyDirMtime  = []byte("dirMtime")
)

// Owner is who holds an address. IfName is empty for reference files of
// versions that recorded only the container id.
type Owner struct {
	ID     string
	IfName string
}

// Allocation is one held address.
type Allocation struct {
	IP       net.IP // 4 bytes for IPv4, 16 for IPv6
	Owner    Owner
	RangeSet int
	// Legacy marks an address read from a reference file; releasing it
	// removes the file.
	Legacy bool
	// Since is when the address was allocated; zero when unknown. Only
	// ForEach (and ReadAll) fill it in; Reserve records the time of the
	// call when it is zero.
	Since time.Time
}

// Store is an open, locked network store. Close releases the lock.
type Store struct {
	dir  string
	lock *filelock.Lock
	db   *bolt.DB
}

// Dir is the network's directory.
func Dir(dataDir, network string) string { return filepath.Join(dataDir, network) }

// Open locks the network's store (waiting at most timeout, then code 11),
// creating it when missing, and imports reference files when the directory
// changed since the last import.
func Open(dataDir, network string, timeout time.Duration) (*Store, error) {
	dir := Dir(dataDir, network)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, cnierr.Internal("create data directory %s: %v", dir, err)
	}
	lock, err := filelock.AcquireQueued(filepath.Join(dir, LockName), timeout)
	if err != nil {
		return nil, cnierr.Wrap(err, "host-local store %s", dir)
	}
	s := &Store{dir: dir, lock: lock}
	if err := s.open(timeout); err != nil {
		lock.Release()
		return nil, err
	}
	if err := s.syncReference(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Store) open(timeout time.Duration) error {
	path := filepath.Join(s.dir, DBName)
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		if err := create(path); err != nil {
			return cnierr.Internal("create store %s: %v", path, err)
		}
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout})
	if errors.Is(err, bolterrors.ErrTimeout) {
		return cnierr.TryAgain("store %s is locked by another process for more than %s; try again later", path, timeout)
	}
	if err != nil {
		return cnierr.Internal("open store %s: %v (move the file away to start afresh; reference-layout files are read again)", path, err)
	}
	s.db = db
	return nil
}

// create makes an empty database under a temporary name and renames it
// into place, so that a crash never leaves a half-initialised file.
func create(path string) error {
	tmp := path + ".tmp"
	_ = os.Remove(tmp) // left by a crash during an earlier creation
	db, err := bolt.Open(tmp, 0o600, nil)
	if err != nil {
		return err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketIPs, bucketOwners, bucketMeta, bucketSince} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, path)
}

// Close closes the database and releases the lock.
func (s *Store) Close() {
	if s.db != nil {
		_ = s.db.Close()
		s.db = nil
	}
	s.lock.Release()
}

// ReadAll returns the allocations of the database file path, opened
// read-only (no lock, no import of reference files, nothing written): what
// an inspection of a node reads, e.g. the tests' leak snapshot.
func ReadAll(path string, timeout time.Duration) ([]Allocation, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: timeout, ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("open store %s read-only: %w", path, err)
	}
	defer db.Close()
	var out []Allocation
	err = db.View(func(btx *bolt.Tx) error {
		return newTx(btx).ForEach(func(a Allocation) error { out = append(out, a); return nil })
	})
	return out, wrapDB(err)
}

// Update runs fn in one read-write transaction: everything fn changes is
// committed atomically, or nothing when fn fails.
func (s *Store) Update(fn func(*Tx) error) error {
	err := s.db.Update(func(btx *bolt.Tx) error {
		if _, err := btx.CreateBucketIfNotExists(bucketSince); err != nil { // a store of an earlier version
			return err
		}
		tx := newTx(btx)
		if err := fn(tx); err != nil {
			return err
		}
		return s.removeReferenceFiles(tx)
	})
	return wrapDB(err)
}

// View runs fn in a read-only transaction.
func (s *Store) View(fn func(*Tx) error) error {
	return wrapDB(s.db.View(func(btx *bolt.Tx) error { return fn(newTx(btx)) }))
}

func wrapDB(err error) error {
	if err == nil {
		return nil
	}
	var ce *types.Error
	if errors.As(err, &ce) {
		return err // a decision of the caller, with its code and message
	}
	return cnierr.Wrap(err, "host-local store")
}

// Tx is one transaction on the store.
type Tx struct {
	tx     *bolt.Tx
	ips    *bolt.Bucket
	owners *bolt.Bucket
	meta   *bolt.Bucket
	since  *bolt.Bucket // nil in a read of a store no write of this version has touched
	cur    *bolt.Cursor // round-robin walk over "ips"
	curKey []byte
	// files are reference files to remove before the commit.
	files []string
}

func newTx(btx *bolt.Tx) *Tx {
	return &Tx{tx: btx, ips: btx.Bucket(bucketIPs), owners: btx.Bucket(bucketOwners), meta: btx.Bucket(bucketMeta), since: btx.Bucket(bucketSince)}
}

func key(a net.IP) []byte { return a.To16() }

func fromKey(k []byte) net.IP {
	a := net.IP(append([]byte(nil), k...))
	if v4 := a.To4(); v4 != nil {
		return v4
	}
	return a
}

func ownerPrefix(o Owner) []byte {
	b := make([]byte, 0, len(o.ID)+len(o.IfName)+2+net.IPv6len)
	b = append(b, o.ID...)
	b = append(b, 0)
	b = append(b, o.IfName...)
	return append(b, 0)
}

func ownerKey(o Owner, a net.IP) []byte { return append(ownerPrefix(o), key(a)...) }

const flagLegacy = 1

func encode(a Allocation) []byte {
	b := make([]byte, 0, 1+2*binary.MaxVarintLen64+len(a.Owner.ID)+len(a.Owner.IfName))
	var flags byte
	if a.Legacy {
		flags |= flagLegacy
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(a.RangeSet))
	b = binary.AppendUvarint(b, uint64(len(a.Owner.ID)))
	b = append(b, a.Owner.ID...)
	return append(b, a.Owner.IfName...)
}

func decode(k, v []byte) (Allocation, error) {
	a := Allocation{IP: fromKey(k)}
	if len(v) < 1 {
		return a, fmt.Errorf("record of %s is empty", a.IP)
	}
	a.Legacy = v[0]&flagLegacy != 0
	v = v[1:]
	rs, n := binary.Uvarint(v)
	if n <= 0 {
		return a, fmt.Errorf("record of %s: bad range set", a.IP)
	}
	v = v[n:]
	l, n := binary.Uvarint(v)
	if n <= 0 || uint64(len(v)-n) < l {
		return a, fmt.Errorf("record of %s: bad owner", a.IP)
	}
	v = v[n:]
	a.RangeSet = int(rs)
	a.Owner = Owner{ID: string(v[:l]), IfName: string(v[l:])}
	return a, nil
}

// Get returns the allocation of an address.
func (t *Tx) Get(a net.IP) (Allocation, bool, error) {
	v := t.ips.Get(key(a))
	if v == nil {
		return Allocation{}, false, nil
	}
	al, err := decode(key(a), v)
	return al, err == nil, err
}

// Taken reports whether an address is allocated. Calls with increasing
// addresses (the round-robin walk) advance one cursor instead of searching
// the tree again.
func (t *Tx) Taken(a net.IP) bool {
	k := key(a)
	if t.cur == nil {
		t.cur = t.ips.Cursor()
	}
	if t.curKey != nil && bytes.Compare(t.curKey, k) < 0 {
		t.curKey, _ = t.cur.Next()
		if t.curKey != nil && bytes.Compare(t.curKey, k) < 0 {
			t.curKey, _ = t.cur.Seek(k)
		}
	} else if t.curKey == nil || bytes.Compare(t.curKey, k) > 0 {
		t.curKey, _ = t.cur.Seek(k)
	}
	return t.curKey != nil && bytes.Equal(t.curKey, k)
}

// ErrTaken is returned by Reserve for an address someone holds.
var ErrTaken = errors.New("address is already allocated")

// Reserve records an allocation; it fails with ErrTaken when the address is
// held.
func (t *Tx) Reserve(a Allocation) error {
	k := key(a.IP)
	if t.ips.Get(k) != nil {
		return ErrTaken
	}
	t.cur, t.curKey = nil, nil // bbolt cursors do not survive a write
	if err := t.ips.Put(k, encode(a)); err != nil {
		return err
	}
	if err := t.putSince(a); err != nil {
		return err
	}
	return t.owners.Put(ownerKey(a.Owner, a.IP), nil)
}

// putSince records when a was allocated (now, unless a.Since says).
func (t *Tx) putSince(a Allocation) error {
	if t.since == nil {
		return nil
	}
	at := a.Since
	if at.IsZero() {
		at = time.Now()
	}
	v := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(a.Owner.ID)+len(a.Owner.IfName)+2), uint64(at.UnixNano()))
	return t.since.Put(key(a.IP), append(v, ownerPrefix(a.Owner)...))
}

// sinceOf is when a was allocated, zero when unknown.
func (t *Tx) sinceOf(a Allocation) time.Time {
	if t.since == nil {
		return time.Time{}
	}
	v := t.since.Get(key(a.IP))
	if len(v) < 8 || !bytes.Equal(v[8:], ownerPrefix(a.Owner)) {
		return time.Time{}
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(v[:8])))
}

// reserveMany records many allocations of free addresses at once. Keys go
// into each index in ascending order: bbolt splits nodes only at commit,
// so keys put in random order into a small tree cost a memmove of the
// whole growing node each (quadratic), while ascending keys are appends.
func (t *Tx) reserveMany(as []Allocation) error {
	t.cur, t.curKey = nil, nil
	sort.Slice(as, func(i, j int) bool { return bytes.Compare(key(as[i].IP), key(as[j].IP)) < 0 })
	for _, a := range as {
		if err := t.ips.Put(key(a.IP), encode(a)); err != nil {
			return err
		}
	}
	owners := make([][]byte, len(as))
	for i, a := range as {
		owners[i] = ownerKey(a.Owner, a.IP)
	}
	sort.Slice(owners, func(i, j int) bool { return bytes.Compare(owners[i], owners[j]) < 0 })
	for _, k := range owners {
		if err := t.owners.Put(k, nil); err != nil {
			return err
		}
	}
	return nil
}

// ByOwner returns what o holds: exact (id, ifname) matches and, as the
// reference does, allocations recorded with the id alone.
func (t *Tx) ByOwner(o Owner) ([]Allocation, error) {
	var out []Allocation
	prefixes := [][]byte{ownerPrefix(o)}
	if o.IfName != "" {
		prefixes = append(prefixes, ownerPrefix(Owner{ID: o.ID}))
	}
	for _, p := range prefixes {
		c := t.owners.Cursor()
		for k, _ := c.Seek(p); k != nil && bytes.HasPrefix(k, p); k, _ = c.Next() {
			ipk := k[len(p):]
			if len(ipk) != net.IPv6len {
				continue
			}
			v := t.ips.Get(ipk)
			if v == nil {
				continue
			}
			a, err := decode(ipk, v)
			if err != nil {
				return nil, err
			}
			out = append(out, a)
		}
	}
	return out, nil
}

// Release frees one allocation (and its reference file, if it has one).
func (t *Tx) Release(a Allocation) error {
	t.cur, t.curKey = nil, nil
	if err := t.ips.Delete(key(a.IP)); err != nil {
		return err
	}
	if err := t.owners.Delete(ownerKey(a.Owner, a.IP)); err != nil {
		return err
	}
	if t.since != nil {
		if err := t.since.Delete(key(a.IP)); err != nil {
			return err
		}
	}
	if a.Legacy {
		t.files = append(t.files, a.IP.String())
	}
	return nil
}

// ReleaseOwner frees everything o holds and returns it.
func (t *Tx) ReleaseOwner(o Owner) ([]Allocation, error) {
	held, err := t.ByOwner(o)
	if err != nil {
		return nil, err
	}
	for _, a := range held {
		if err := t.Release(a); err != nil {
			return nil, err
		}
	}
	return held, nil
}

// ForEach calls fn for every allocation, in address order, with the time
// it was made when known (Since). fn must not change the store; collect
// and release afterwards.
func (t *Tx) ForEach(fn func(Allocation) error) error {
	return t.ips.ForEach(func(k, v []byte) error {
		a, err := decode(k, v)
		if err != nil {
			return err
		}
		a.Since = t.sinceOf(a)
		return fn(a)
	})
}

func lastReservedKey(rangeSet int) []byte {
	return []byte("lastReserved." + strconv.Itoa(rangeSet))
}

// LastReserved is the address most recently allocated from a range set, or
// nil.
func (t *Tx) LastReserved(rangeSet int) net.IP {
	v := t.meta.Get(lastReservedKey(rangeSet))
	if len(v) != net.IPv6len {
		return nil
	}
	return fromKey(v)
}

// SetLastReserved records the round-robin position of a range set.
func (t *Tx) SetLastReserved(rangeSet int, a net.IP) error {
	return t.meta.Put(lastReservedKey(rangeSet), key(a))
}

// Verify checks that the two indexes agree: every address has exactly the
// owner entry that points back to it, and no owner entry points to an
// address held by someone else. Tests use it after crashes.
func (t *Tx) Verify() error {
	n := 0
	err := t.ips.ForEach(func(k, v []byte) error {
		a, err := decode(k, v)
		if err != nil {
			return err
		}
		if t.owners.Get(ownerKey(a.Owner, a.IP)) == nil {
			return fmt.Errorf("%s is held by %v but missing from the owner index", a.IP, a.Owner)
		}
		n++
		return nil
	})
	if err != nil {
		return err
	}
	m := 0
	err = t.owners.ForEach(func(k, _ []byte) error {
		m++
		if len(k) < net.IPv6len+2 {
			return fmt.Errorf("owner key %q is too short", k)
		}
		ipk := k[len(k)-net.IPv6len:]
		v := t.ips.Get(ipk)
		if v == nil {
			return fmt.Errorf("owner entry %q points to the free address %s", k[:len(k)-net.IPv6len], fromKey(ipk))
		}
		a, err := decode(ipk, v)
		if err != nil {
			return err
		}
		if !bytes.Equal(ownerKey(a.Owner, a.IP), k) {
			return fmt.Errorf("owner entry %q points to %s, held by %v", k[:len(k)-net.IPv6len], a.IP, a.Owner)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if n != m {
		return fmt.Errorf("%d addresses but %d owner entries", n, m)
	}
	return nil
}
