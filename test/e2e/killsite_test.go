//go:build kernel

package e2e

import (
	"bytes"
	"debug/elf"
	"debug/gosym"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Where a killed command stood, as code: the crash tests stop it at the
// drawn instant (SIGSTOP), look, then kill it. What they look at is each
// thread's user-space stack: the first function of meshwire's own code
// on it, the code point the kill interrupted. A thread running meshwire's
// code is there; one in a system call (a netlink request, a wait for a
// firewall tool) has the call's caller above its stack pointer; the
// runtime's idle threads have none.

// meshwireCode tells whether fn, a function name from a binary's pclntab,
// is meshwire's own code: its module's packages or a command's main.
func meshwireCode(fn string) bool {
	return strings.HasPrefix(fn, "github.com/meshwire/meshwire/") || strings.HasPrefix(fn, "main.")
}

var (
	tablesMu sync.Mutex
	tables   = map[string]*gosym.Table{} // by executable path and modification time
)

// exeTable is the symbol table of the executable pid runs, from its
// .gopclntab (which stripped Go binaries keep).
func exeTable(pid int) (*gosym.Table, error) {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return nil, err
	}
	info, err := os.Stat(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return nil, err
	}
	key := exe + "@" + info.ModTime().String()
	tablesMu.Lock()
	defer tablesMu.Unlock()
	if t, ok := tables[key]; ok {
		return t, nil
	}
	f, err := elf.Open(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	pcln, text := f.Section(".gopclntab"), f.Section(".text")
	if pcln == nil || text == nil {
		return nil, fmt.Errorf("%s: not a Go executable", filepath.Base(exe))
	}
	data, err := pcln.Data()
	if err != nil {
		return nil, err
	}
	t, err := gosym.NewTable(nil, gosym.NewLineTable(data, text.Addr))
	if err != nil {
		return nil, err
	}
	tables[key] = t
	return t, nil
}

// waitStopped waits (a little) until every thread of pid is stopped.
func waitStopped(pid int) {
	for deadline := time.Now().Add(200 * time.Millisecond); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		tids, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return
		}
		all := true
		for _, t := range tids {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
			if err != nil {
				continue
			}
			f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
			if len(f) > 0 && f[0] != "T" && f[0] != "t" {
				all = false
			}
		}
		if all {
			return
		}
	}
}

// stackScan is how far above a thread's stack pointer the look goes.
const stackScan = 32 << 10

// meshwireFrames lists, sorted and each once, the first function of
// meshwire's code on each thread of the stopped Go process pid, without
// the module's prefix ("plugins/main/bridge.setupVeth", "main.cmdAdd");
// none when no thread is in meshwire's code (the runtime starting or
// ending the process, a goroutine parked on a channel).
func meshwireFrames(pid int) ([]string, error) {
	tab, err := exeTable(pid)
	if err != nil {
		return nil, err
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		return nil, err
	}
	defer mem.Close()
	tids, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	var out []string
	add := func(fn *gosym.Func) {
		out = append(out, strings.TrimPrefix(fn.Name, "github.com/meshwire/meshwire/"))
	}
	for _, t := range tids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/syscall", pid, t.Name()))
		if err != nil {
			continue
		}
		// "NR ARGS... SP PC", or "-1 SP PC" outside a system call.
		f := strings.Fields(string(b))
		if len(f) < 3 {
			continue // "running": not stopped
		}
		sp, err1 := strconv.ParseUint(f[len(f)-2], 0, 64)
		pc, err2 := strconv.ParseUint(f[len(f)-1], 0, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		if fn := tab.PCToFunc(pc); fn != nil && meshwireCode(fn.Name) {
			add(fn)
			continue
		}
		// The nearest return address into meshwire's code above the
		// stack pointer: a word that points just past a call in a
		// function (never at its entry, as a function value would).
		buf := make([]byte, stackScan)
		n := 0
		for n < len(buf) {
			k, err := mem.ReadAt(buf[n:n+4096], int64(sp)+int64(n))
			n += k
			if err != nil || k < 4096 {
				break
			}
		}
		for off := 0; off+8 <= n; off += 8 {
			ret := binary.LittleEndian.Uint64(buf[off:])
			if fn := tab.PCToFunc(ret - 1); fn != nil && ret != fn.Entry && meshwireCode(fn.Name) {
				add(fn)
				break
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// codeSite names the code point of a stopped process for the tally: its
// meshwire frames, or why there are none.
func codeSite(pid int) string {
	fns, err := meshwireFrames(pid)
	switch {
	case err != nil:
		return "not a Go process we can read (" + err.Error() + ")"
	case len(fns) == 0:
		return "outside meshwire's code"
	}
	return strings.Join(fns, " + ")
}
