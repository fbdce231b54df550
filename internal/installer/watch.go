package installer

import (
	"errors"
	"os"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The config directory is watched with inotify rather than polled: another
// installer (flannel, calico, cilium) rewrites the primary config when its
// pod starts, and every pod created before meshwire's plugins are back in it
// runs without interception, so the change is picked up at once (about
// 100 ms, see settle) instead of after a polling interval, and an idle node
// costs nothing. inotify follows inodes, so it sees the host's writes through
// the DaemonSet's hostPath mount. Watch still re-checks every Resync, which
// covers what inotify cannot report (an event queue overflow, the directory
// itself replaced or unmounted) and retries a config that was not valid JSON.

// watchMask: a file created, written, renamed in or out, or removed.
const watchMask = unix.IN_CREATE | unix.IN_CLOSE_WRITE | unix.IN_MODIFY | unix.IN_MOVED_TO |
	unix.IN_MOVED_FROM | unix.IN_DELETE | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF

// watcher reports, on C, that something changed in a directory. C is
// closed when the watch ends (Err says why).
type watcher struct {
	C    chan struct{}
	f    *os.File
	mu   sync.Mutex
	err  error
	done chan struct{}
}

// watchDir starts watching dir.
func watchDir(dir string) (*watcher, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, os.NewSyscallError("inotify_init1", err)
	}
	if _, err := unix.InotifyAddWatch(fd, dir, watchMask); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("inotify_add_watch", err)
	}
	// A non-blocking descriptor goes to Go's poller: Read parks the
	// goroutine, and Close wakes it.
	w := &watcher{C: make(chan struct{}, 1), f: os.NewFile(uintptr(fd), "inotify"), done: make(chan struct{})}
	go w.read()
	return w, nil
}

func (w *watcher) read() {
	defer close(w.done)
	defer close(w.C)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil {
			w.setErr(err)
			return
		}
		relevant, gone := parseEvents(buf[:n])
		if relevant {
			select {
			case w.C <- struct{}{}:
			default:
			}
		}
		if gone {
			w.setErr(errors.New("the directory was removed or moved"))
			return
		}
	}
}

// parseEvents reads a buffer of inotify events: whether one concerns a file
// a runtime could read as a config (meshwire's own temporary files are
// hidden and do not), and whether the watch is gone.
func parseEvents(buf []byte) (relevant, gone bool) {
	for len(buf) >= unix.SizeofInotifyEvent {
		ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[0]))
		end := unix.SizeofInotifyEvent + int(ev.Len)
		if end > len(buf) {
			break
		}
		name := buf[unix.SizeofInotifyEvent:end]
		for i, c := range name {
			if c == 0 {
				name = name[:i]
				break
			}
		}
		switch {
		case ev.Mask&(unix.IN_IGNORED|unix.IN_DELETE_SELF|unix.IN_MOVE_SELF|unix.IN_UNMOUNT) != 0:
			relevant, gone = true, true
		case ev.Mask&unix.IN_Q_OVERFLOW != 0:
			relevant = true
		case IsConfName(string(name)):
			relevant = true
		}
		buf = buf[end:]
	}
	return relevant, gone
}

func (w *watcher) setErr(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
	}
}

// Err is why the watch ended.
func (w *watcher) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// Drain forgets the changes reported so far.
func (w *watcher) Drain() {
	select {
	case <-w.C:
	default:
	}
}

// Close ends the watch.
func (w *watcher) Close() {
	w.f.Close()
	<-w.done
}
