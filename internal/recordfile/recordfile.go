// Package recordfile keeps small JSON records on the node, one file per
// pod attachment, so that a command killed at any instruction leaves
// either the whole record or a temporary file its next Remove finds by
// name. Its user is the pods' records (package podstate), and the
// reading of the stores of earlier versions.
package recordfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Name is a record's file name for the attachment of container id on
// interface ifName: one record per attachment, as the runtime's DEL names
// it.
func Name(id, ifName string) string {
	return strings.NewReplacer("/", "_", "\x00", "_").Replace(id + "-" + ifName)
}

// Write keeps v as name under dir, whole or not at all (a temporary file
// renamed); what names the record in errors.
func Write(dir, name, what string, v any) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create the directory of %s: %w", what, err)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	// Named after the record, so that the DEL after a kill between the
	// write and the rename finds it (Remove).
	f, err := os.CreateTemp(dir, TmpPrefix(name)+"*")
	if err != nil {
		return fmt.Errorf("write %s: %w", what, err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), filepath.Join(dir, name))
	}
	if err != nil {
		_ = os.Remove(f.Name())
		return fmt.Errorf("write %s: %w", what, err)
	}
	return nil
}

// Remove removes record name under dir, and what a write of it cut short
// left; none is not an error.
func Remove(dir, name, what string) error {
	if err := os.Remove(filepath.Join(dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", what, err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", what, err)
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), TmpPrefix(name)) {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
				return fmt.Errorf("remove %s: %w", what, err)
			}
		}
	}
	return nil
}

// Exists tells whether record name is under dir.
func Exists(dir, name string) bool {
	_, err := os.Stat(filepath.Join(dir, name))
	return err == nil
}

// ReadAll decodes every record under dir with decode (file name -> value)
// and returns the names of the files that are not records: temporary
// files of a write cut short, unreadable or undecodable ones. A missing
// directory holds no record.
func ReadAll[T any](dir, what string) (recs map[string]T, bad []string, err error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", what, err)
	}
	recs = map[string]T{}
	for _, e := range entries {
		var r T
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err != nil || strings.HasPrefix(e.Name(), tmpMark) {
			bad = append(bad, e.Name())
			continue
		}
		recs[e.Name()] = r
	}
	return recs, bad, nil
}

const tmpMark = ".tmp-"

// TmpPrefix begins the name of the temporary file a write of record name
// uses.
func TmpPrefix(name string) string { return tmpMark + name + "-" }
