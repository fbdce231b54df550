// Package installer is `meshwire install`, the node installer a DaemonSet
// runs with the host's CNI binary and config directories mounted. It copies
// the plugins into the binary directory, then either writes meshwire's own
// conflist or chains meshwire's plugins (intercept, and portmap and
// bandwidth when the config has none) at the end of the node's primary
// config, and keeps that change applied while another installer rewrites
// the config, until it is told to stop (and, if asked, to remove it).
//
// The decisions are functions of plain values (Primary, Chain, Unchain,
// EarlierConversion), table-tested without a node; the file system part is
// small: atomic writes (temporary file, fsync, rename) and inotify.
package installer

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Options are the command line's.
type Options struct {
	BinDir, ConfDir string // the host's CNI directories
	SourceDir       string // where the plugins to install are
	Chain           bool   // chain into the primary config instead of writing OwnConflist
	Once            bool   // apply once and return, instead of watching
	CleanupOnExit   bool   // when ctx ends, take back the config change
	// KeepOnExit, when set, is asked when ctx ends, before CleanupOnExit
	// takes the change back: true keeps it (this installer is being
	// replaced, and the next one takes the config over).
	KeepOnExit      func() bool
	DefaultConflist []byte // OwnConflist's contents (without Chain)
	// PodCIDRs, Intercept and CNIVersion change OwnConflist (without Chain): see
	// OwnOptions.
	PodCIDRs   []string
	Intercept  bool
	CNIVersion string
	// ProxyMetadata is the mesh-wide sidecar environment put in the
	// chained intercept entry (with Chain; see ChainOptions).
	ProxyMetadata map[string]string
	// PluginLog, when set, is the JSON log file every plugin meshwire
	// configures writes (the "log" object of the entries it chains, or of
	// every plugin of OwnConflist).
	PluginLog string
	// Resync is how often the watch re-checks everything (and retries a
	// failure) even without an event; default 10s.
	Resync time.Duration
}

// Installer does the work of Run; its steps are exported for tests.
type Installer struct {
	o        Options
	binStamp map[string]stamp // what the installed binaries looked like
	lastErr  string           // the error last logged, to log a repeat once
	warned   string           // the shadowing file last warned about
	applied  bool             // Apply succeeded once: say no more when nothing changes
	tookBack atomic.Bool      // Run's end took the config change back

	mu    sync.Mutex
	state State
}

// State is what the installer has achieved so far, for the node agent's
// probes and metrics. It is safe to read while Run goes on.
type State struct {
	BinariesInstalled bool   // every plugin is in the binary directory
	Applied           bool   // the last Apply succeeded
	LastError         string // why the last InstallBinaries or Apply failed
	Applies, Failures uint64 // Apply calls that succeeded, that failed
}

// State returns a copy of the installer's state.
func (in *Installer) State() State {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.state
}

// record notes the outcome of InstallBinaries (binaries) or Apply.
func (in *Installer) record(binaries bool, err error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.state.LastError = ""
	if err != nil {
		in.state.LastError = err.Error()
	}
	if binaries {
		in.state.BinariesInstalled = err == nil
		return
	}
	in.state.Applied = err == nil
	if err == nil {
		in.state.Applies++
	} else {
		in.state.Failures++
	}
}

// stamp identifies a file's version without reading it.
type stamp struct {
	ino, size int64
	mtime     time.Time
}

// New checks o and returns an installer.
func New(o Options) (*Installer, error) {
	for _, d := range []struct{ flag, dir string }{{"--cni-bin-dir", o.BinDir}, {"--cni-conf-dir", o.ConfDir}, {"--source-dir", o.SourceDir}} {
		if d.dir == "" {
			return nil, fmt.Errorf("%s is empty", d.flag)
		}
		st, err := os.Stat(d.dir)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", d.flag, err)
		}
		if !st.IsDir() {
			return nil, fmt.Errorf("%s: %s is not a directory", d.flag, d.dir)
		}
	}
	if !o.Chain && len(o.DefaultConflist) == 0 {
		return nil, errors.New("no conflist to write")
	}
	if o.Chain && (len(o.PodCIDRs) > 0 || o.Intercept || o.CNIVersion != "") {
		return nil, errors.New("the pod CIDRs, the CNI version and intercept shape meshwire's own conflist, which is not written with --chain")
	}
	if o.Resync <= 0 {
		o.Resync = 10 * time.Second
	}
	if o.PluginLog != "" && !filepath.IsAbs(o.PluginLog) {
		return nil, fmt.Errorf("the plugin log %q is not an absolute path", o.PluginLog)
	}
	if !o.Chain {
		if err := CheckConflist(o.DefaultConflist); err != nil {
			return nil, fmt.Errorf("the conflist to write: %w", err)
		}
		own, err := OwnConflistWith(o.DefaultConflist, OwnOptions{
			PodCIDRs: o.PodCIDRs, Intercept: o.Intercept, CNIVersion: o.CNIVersion,
			Chain: ChainOptions{ProxyMetadata: o.ProxyMetadata, LogFile: o.PluginLog},
		})
		if err != nil {
			return nil, fmt.Errorf("the conflist to write: %w", err)
		}
		o.DefaultConflist = own
	}
	if o.PluginLog != "" && !o.Chain {
		withLog, err := WithLog(o.DefaultConflist, o.PluginLog)
		if err != nil {
			return nil, fmt.Errorf("the conflist to write: %w", err)
		}
		o.DefaultConflist = withLog
	}
	return &Installer{o: o}, nil
}

// Run installs, then, unless the options' Once, keeps the config applied
// until ctx ends, and then with CleanupOnExit takes it back. With Once, an
// error (a config that is not JSON, no primary config to chain into) is
// returned; while watching it is logged and retried at the next change or
// resync.
func (in *Installer) Run(ctx context.Context) error {
	if err := in.InstallBinaries(); err != nil {
		return err
	}
	if in.o.Once {
		return in.Apply()
	}
	in.Watch(ctx)
	if !in.o.CleanupOnExit {
		slog.Info("stopping; the plugins and the config stay in place")
		return nil
	}
	if in.o.KeepOnExit != nil && in.o.KeepOnExit() {
		slog.Info("stopping; the plugins and the config stay in place for the installer that replaces this one")
		return nil
	}
	if err := in.Cleanup(); err != nil {
		return err
	}
	in.tookBack.Store(true)
	return nil
}

// TookBack reports whether Run, ending, took the config change back (with
// CleanupOnExit, no KeepOnExit answering true, and a Cleanup that
// succeeded): the node's runtime no longer calls meshwire's plugin.
func (in *Installer) TookBack() bool { return in.tookBack.Load() }

// report logs err, once while it stays the same.
func (in *Installer) report(err error) {
	if err == nil {
		if in.lastErr != "" {
			slog.Info("config applied again")
		}
		in.lastErr = ""
		return
	}
	if err.Error() != in.lastErr {
		slog.Error("could not install; retrying on the next change and every "+in.o.Resync.String(), "error", err)
	}
	in.lastErr = err.Error()
}

// InstallBinaries copies Binaries from the source to the binary directory.
func (in *Installer) InstallBinaries() error {
	err := in.installBinaries()
	in.record(true, err)
	return err
}

func (in *Installer) installBinaries() error {
	if gone, err := removeTemps(in.o.BinDir); err != nil {
		return fmt.Errorf("%s: %w", in.o.BinDir, err)
	} else if len(gone) > 0 {
		slog.Info("removed temporary files of an earlier run", "dir", in.o.BinDir, "files", strings.Join(gone, ", "))
	}
	stamps := map[string]stamp{}
	unchanged := 0
	for _, b := range Binaries() {
		src := filepath.Join(in.o.SourceDir, b.Source)
		changed, err := CopyBinary(src, in.o.BinDir, b.Name)
		if err != nil {
			return fmt.Errorf("install %s as %s: %w", src, filepath.Join(in.o.BinDir, b.Name), err)
		}
		if changed {
			slog.Info("installed " + filepath.Join(in.o.BinDir, b.Name))
		} else {
			unchanged++
		}
		if s, ok := stampOf(filepath.Join(in.o.BinDir, b.Name)); ok {
			stamps[b.Name] = s
		}
	}
	if unchanged > 0 {
		slog.Info(fmt.Sprintf("%d plugins already up to date", unchanged), "dir", in.o.BinDir)
	}
	in.binStamp = stamps
	return nil
}

// binariesTouched reports whether an installed binary was replaced or
// changed since InstallBinaries (another installer copied its own portmap
// or bandwidth, say).
func (in *Installer) binariesTouched() bool {
	for name, was := range in.binStamp {
		if now, ok := stampOf(filepath.Join(in.o.BinDir, name)); !ok || now != was {
			return true
		}
	}
	return false
}

func stampOf(path string) (stamp, bool) {
	st, err := os.Stat(path)
	if err != nil {
		return stamp{}, false
	}
	s := stamp{size: st.Size(), mtime: st.ModTime()}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		s.ino = int64(sys.Ino)
	}
	return s, true
}

// confNames lists the config directory.
func (in *Installer) confNames() ([]string, error) {
	ents, err := os.ReadDir(in.o.ConfDir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names, nil
}

// Apply makes the config directory what it should be: OwnConflist written,
// or meshwire's plugins chained into the primary config.
func (in *Installer) Apply() error {
	err := in.apply()
	in.record(false, err)
	return err
}

func (in *Installer) apply() error {
	dir := in.o.ConfDir
	if gone, err := removeTemps(dir); err != nil {
		return fmt.Errorf("%s: %w", dir, err)
	} else if len(gone) > 0 {
		slog.Info("removed temporary files of an earlier run", "dir", dir, "files", strings.Join(gone, ", "))
	}
	names, err := in.confNames()
	if err != nil {
		return err
	}
	if !in.o.Chain {
		err = in.applyOwn(names)
	} else {
		err = in.applyChain(names)
	}
	if err == nil {
		in.applied = true
	}
	return err
}

// upToDate logs, on the first Apply only, that nothing needed changing.
func (in *Installer) upToDate(msg string) {
	if !in.applied {
		slog.Info(msg)
	}
}

func (in *Installer) applyOwn(names []string) error {
	dir := in.o.ConfDir
	changed, err := WriteFile(dir, OwnConflist, in.o.DefaultConflist)
	if err != nil {
		return fmt.Errorf("write %s: %w", filepath.Join(dir, OwnConflist), err)
	}
	if changed {
		slog.Info("wrote " + filepath.Join(dir, OwnConflist))
	} else {
		in.upToDate(filepath.Join(dir, OwnConflist) + " is up to date")
	}
	if first := First(append(names, OwnConflist)); first != OwnConflist && first != in.warned {
		slog.Warn("runtimes use " + filepath.Join(dir, first) + ", which sorts before " + OwnConflist)
		in.warned = first
	}
	return nil
}

func (in *Installer) applyChain(names []string) error {
	dir := in.o.ConfDir
	for _, n := range names {
		if n == OwnConflist {
			// Left by a run without --chain: it would shadow the
			// config meshwire chains into.
			if err := removeFile(dir, n); err != nil {
				return fmt.Errorf("remove %s: %w", filepath.Join(dir, n), err)
			}
			slog.Info("removed " + filepath.Join(dir, n) + " (written by a run without --chain)")
		}
	}
	primary := Primary(names)
	if primary == "" {
		return fmt.Errorf("no CNI config in %s to chain into yet", dir)
	}
	path := filepath.Join(dir, primary)
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	e, err := ChainWith(data, ChainOptions{ProxyMetadata: in.o.ProxyMetadata, LogFile: in.o.PluginLog})
	if err != nil {
		return fmt.Errorf("%s: %w (left as it is)", path, err)
	}
	if !e.Converted {
		if !e.Changed {
			in.upToDate(path + " already has meshwire's plugins")
			return nil
		}
		if _, err := WriteFile(dir, primary, e.Out); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
		slog.Info("chained " + describeAdded(e) + " into " + path)
		return nil
	}
	// A single-plugin config: write the list under the .conflist name,
	// then remove the old file, so that runtimes always find one of them.
	target := ConflistName(primary)
	tpath := filepath.Join(dir, target)
	if old, err := os.ReadFile(tpath); err == nil {
		if !EarlierConversion(old, data) {
			return fmt.Errorf("%s: cannot convert it into %s, which exists and holds another network (left as they are)", path, tpath)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if _, err := WriteFile(dir, target, e.Out); err != nil {
		return fmt.Errorf("write %s: %w", tpath, err)
	}
	if err := removeFile(dir, primary); err != nil {
		return fmt.Errorf("remove %s (converted into %s): %w", path, tpath, err)
	}
	slog.Info("converted " + path + " into " + tpath + " and chained " + describeAdded(e))
	return nil
}

func describeAdded(e Edit) string {
	if len(e.Added) == 0 {
		return "nothing new (meshwire's plugins moved back to the end)"
	}
	return strings.Join(e.Added, ", ")
}

// Cleanup takes back the config change: OwnConflist removed, or meshwire's
// plugins taken out of every config that has them (a config converted from
// a single plugin stays a list, with that one plugin). The binaries stay:
// pods still running may need them for DEL.
func (in *Installer) Cleanup() error {
	dir := in.o.ConfDir
	if !in.o.Chain {
		if _, err := os.Stat(filepath.Join(dir, OwnConflist)); errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if err := removeFile(dir, OwnConflist); err != nil {
			return fmt.Errorf("remove %s: %w", filepath.Join(dir, OwnConflist), err)
		}
		slog.Info("removed " + filepath.Join(dir, OwnConflist))
		return nil
	}
	names, err := in.confNames()
	if err != nil {
		return err
	}
	var errs []error
	for _, n := range names {
		if !IsConfName(n) {
			continue
		}
		path := filepath.Join(dir, n)
		data, err := os.ReadFile(path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !bytes.Contains(data, []byte(Marker)) {
			continue
		}
		e, err := Unchain(data)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w (left as it is)", path, err))
			continue
		}
		if !e.Changed {
			continue
		}
		if _, err := WriteFile(dir, n, e.Out); err != nil {
			errs = append(errs, fmt.Errorf("write %s: %w", path, err))
			continue
		}
		slog.Info("removed " + strings.Join(e.Removed, ", ") + " from " + path)
	}
	return errors.Join(errs...)
}

// Watch applies the config, then again whenever the config directory
// changes, and every Resync, until ctx ends. It watches with inotify (see
// watcher), set up before the first Apply so that no change goes unseen,
// and falls back to the resync alone when inotify is not available.
func (in *Installer) Watch(ctx context.Context) {
	w, err := watchDir(in.o.ConfDir)
	if err != nil {
		slog.Warn("cannot watch "+in.o.ConfDir+"; checking it every "+in.o.Resync.String(), "error", err)
	} else {
		slog.Info("watching " + in.o.ConfDir)
	}
	defer func() {
		if w != nil {
			w.Close()
		}
	}()
	tick := time.NewTicker(in.o.Resync)
	defer tick.Stop()
	for {
		in.report(in.Apply())
		var events <-chan struct{}
		if w != nil {
			events = w.C
		}
		select {
		case <-ctx.Done():
			return
		case _, ok := <-events:
			if !ok {
				slog.Warn("lost the watch on "+in.o.ConfDir+"; checking it every "+in.o.Resync.String(), "error", w.Err())
				w.Close()
				w = nil
				continue
			}
			// Let a burst of writes (a writer that is not atomic, a
			// temporary file then a rename) settle.
			select {
			case <-ctx.Done():
				return
			case <-time.After(settle):
			}
			w.Drain()
		case <-tick.C:
			if w == nil {
				if w, err = watchDir(in.o.ConfDir); err == nil {
					slog.Info("watching " + in.o.ConfDir)
				}
			}
			if in.binariesTouched() {
				slog.Info("plugins in " + in.o.BinDir + " changed; installing again")
				if err := in.InstallBinaries(); err != nil {
					slog.Error("could not install", "error", err)
				}
			}
		}
	}
}

// settle is how long an event waits for the writes after it.
const settle = 100 * time.Millisecond
