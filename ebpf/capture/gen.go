package capture

// The BPF object is compiled from capture.c, beside this file, with the
// headers both programs share from ../include, by bpf2go (`make generate`,
// which installs clang and libbpf's headers when missing); the generated Go
// and the object are committed, so building meshwire needs no clang.
//go:generate go run github.com/cilium/ebpf/cmd/bpf2go -tags linux -cc clang -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu -I../include" -target bpfel bpf capture.c
