package fastpath

import (
	"bytes"
	"testing"

	"github.com/cilium/ebpf/btf"
)

// TestSplicesRedirected: the probe answers yes only for a kernel whose
// struct proto has splice_read and whose tcp_bpf has a splice function of
// its own (the two halves of the patch series), from BTF built here.
func TestSplicesRedirected(t *testing.T) {
	ret := &btf.Int{Name: "int", Size: 4, Encoding: btf.Signed}
	fn := func(name string) *btf.Func {
		return &btf.Func{Name: name, Type: &btf.FuncProto{Return: ret}, Linkage: btf.StaticFunc}
	}
	proto := func(members ...string) *btf.Struct {
		s := &btf.Struct{Name: "proto", Size: uint32(8 * len(members))}
		for i, m := range members {
			s.Members = append(s.Members, btf.Member{Name: m, Type: &btf.Pointer{Target: ret}, Offset: btf.Bits(64 * i)})
		}
		return s
	}
	for _, tc := range []struct {
		name  string
		types []btf.Type
		want  bool
	}{
		{"released kernel", []btf.Type{proto("recvmsg", "sendmsg"), fn("tcp_bpf_recvmsg"), fn("tcp_splice_read")}, false},
		{"struct proto has splice_read, tcp_bpf does not", []btf.Type{proto("recvmsg", "splice_read"), fn("tcp_bpf_recvmsg"), fn("tcp_splice_read")}, false},
		{"tcp_bpf splices, struct proto has no member", []btf.Type{proto("recvmsg"), fn("tcp_bpf_splice_read")}, false},
		{"both", []btf.Type{proto("recvmsg", "splice_read"), fn("tcp_bpf_recvmsg"), fn("tcp_bpf_splice_read")}, true},
		{"no struct proto", []btf.Type{fn("tcp_bpf_splice_read")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := btf.NewBuilder(tc.types)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := b.Marshal(nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			spec, err := btf.LoadSpecFromReader(bytes.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			if got := splicesRedirected(spec); got != tc.want {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}
