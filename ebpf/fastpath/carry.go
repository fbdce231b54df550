package fastpath

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/meshwire/meshwire/ebpf/fastpath/podpolicy"
	"github.com/meshwire/meshwire/ebpf/loader"
)

// readPodPolicies reads the pod policies pinned at dir (none in a layout
// without them, v1).
func readPodPolicies(dir string) (map[uint64]podpolicy.Value, error) {
	pods, err := ebpf.LoadPinnedMap(filepath.Join(dir, pinPods), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open the pinned pod policies: %w", err)
	}
	defer pods.Close()
	out := map[uint64]podpolicy.Value{}
	var k uint64
	var v podpolicy.Value
	it := pods.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read the pod policies: %w", err)
	}
	return out, nil
}

// rulesPin is the pin, relative to dir, of one of the maps that mirror the
// meshed pods' interception settings (package pods writes them under
// loader.RulesDir, as it writes ebpf interception's).
func rulesPin(dir, name string) string {
	rel, _ := filepath.Rel(dir, filepath.Join(loader.RulesDir(dir), name))
	return rel
}

// keptEntry is one entry of a mirrored-settings map, as bytes: pin names
// the map.
type keptEntry struct {
	pin        string
	key, value []byte
}

// readRules reads the mirrored interception settings pinned under dir (an
// attached build's, to carry over); none when it pinned none (an earlier
// build).
func readRules(dir string) ([]keptEntry, error) {
	var out []keptEntry
	for _, name := range []string{loader.PinPods, loader.PinPorts, loader.PinCIDRs} {
		m, err := ebpf.LoadPinnedMap(filepath.Join(loader.RulesDir(dir), name), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("open the pinned interception settings: %w", err)
		}
		var k, v []byte
		it := m.Iterate()
		for it.Next(&k, &v) {
			out = append(out, keptEntry{name, slices.Clone(k), slices.Clone(v)})
		}
		err = it.Err()
		m.Close()
		if err != nil {
			return nil, fmt.Errorf("read the interception settings: %w", err)
		}
	}
	return out, nil
}

// writeRules writes entries read by readRules into objs' maps: ports and
// ranges before the pods' entries, as pods.Register does.
func writeRules(objs *bpfObjects, entries []keptEntry) error {
	to := map[string]*ebpf.Map{loader.PinPods: objs.MwRulesPods, loader.PinPorts: objs.MwRulesPorts, loader.PinCIDRs: objs.MwRulesCidrs}
	for _, pass := range []func(string) bool{
		func(pin string) bool { return pin != loader.PinPods },
		func(pin string) bool { return pin == loader.PinPods },
	} {
		for _, e := range entries {
			if !pass(e.pin) {
				continue
			}
			if err := to[e.pin].Put(e.key, e.value); err != nil {
				return fmt.Errorf("carry over the interception settings: %w", err)
			}
		}
	}
	return nil
}
