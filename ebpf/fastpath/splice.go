package fastpath

import (
	"strings"
	"sync"

	"github.com/cilium/ebpf/btf"

	"github.com/meshwire/meshwire/ebpf/loader"
)

// Bytes the fast path hands over wait in the receiver's psock queue, which
// no released kernel's splice() reads: tcp_bpf's struct proto has no
// splice_read. The patch series that adds it ("bpf/sockmap: add splice
// support for tcp_bpf", bpf-next, March 2026) gives struct proto a
// splice_read member and tcp_bpf a splice_read function of its own; a
// kernel that has both splices redirected bytes, and the fast path may
// feed every receiver, whatever it reads with.

// SplicesRedirected reports whether the running kernel's splice() reads
// bytes the fast path redirected, from its BTF (/sys/kernel/btf/vmlinux).
// The answer is computed once per process.
func SplicesRedirected() (bool, error) {
	spliceOnce.Do(func() {
		spec, err := btf.LoadKernelSpec()
		if err != nil {
			spliceErr = loader.Unsupported("read the kernel's BTF: %v", err)
			return
		}
		spliceOK = splicesRedirected(spec)
	})
	return spliceOK, spliceErr
}

var (
	spliceOnce sync.Once
	spliceOK   bool
	spliceErr  error
)

// splicesRedirected is SplicesRedirected for a given BTF: struct proto has
// a splice_read member, and a function of tcp_bpf's (tcp_bpf_*) splices.
func splicesRedirected(spec *btf.Spec) bool {
	types, err := spec.AnyTypesByName("proto")
	if err != nil {
		return false
	}
	member := false
	for _, t := range types {
		if s, ok := t.(*btf.Struct); ok {
			for _, m := range s.Members {
				member = member || m.Name == "splice_read"
			}
		}
	}
	if !member {
		return false
	}
	for t, err := range spec.All() {
		if err != nil {
			return false
		}
		if f, ok := t.(*btf.Func); ok && strings.HasPrefix(f.Name, "tcp_bpf_") && strings.Contains(f.Name, "splice") {
			return true
		}
	}
	return false
}
