// Package nsmap finds, in a BPF hash map keyed by network namespace cookie,
// the entries whose namespace is gone: pods removed without a DEL (a
// crashed runtime, a node restored with its pins). Each entry records its
// namespace's nsfs inode when it is written; the cookie cannot be mapped
// back to a namespace from user space, the inode can (netns.Live).
package nsmap

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// Stale returns the entries of m (namespace cookie -> nsfs inode, from
// inode) whose namespace live, called after m was read, does not list. An
// entry written after the read is not among them, so a pod being added is
// never stale. Entries with inode 0 (written by a build that did not
// record it) are never stale.
func Stale[V any](m *ebpf.Map, inode func(*V) uint64, live func() (map[uint64]bool, error)) (map[uint64]uint64, error) {
	entries := map[uint64]uint64{}
	var ns uint64
	var v V
	it := m.Iterate()
	for it.Next(&ns, &v) {
		if ino := inode(&v); ino != 0 {
			entries[ns] = ino
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("walk %s: %w", m, err)
	}
	if len(entries) == 0 {
		return nil, nil
	}
	alive, err := live()
	if err != nil {
		return nil, err
	}
	for ns, ino := range entries {
		if alive[ino] {
			delete(entries, ns)
		}
	}
	return entries, nil
}

// ForgetStale calls forget for the entry of namespace cookie ns when m
// still holds it with the inode Stale reported: an entry written again
// since (the same cookie never comes back, but a rewrite can) stays.
func ForgetStale[V any](m *ebpf.Map, inode func(*V) uint64, ns, ino uint64, forget func() error) error {
	var v V
	switch err := m.Lookup(ns, &v); {
	case errors.Is(err, ebpf.ErrKeyNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("read %s: %w", m, err)
	case inode(&v) != ino:
		return nil
	}
	return forget()
}
