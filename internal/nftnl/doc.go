// Package nftnl speaks nf_tables' netlink protocol for meshwire's firewall
// (internal/firewall and its netlink half, internal/firewall/fwnetlink,
// its only users). It does reads (Conn.Get, and Conn.Dump,
// checked against the ruleset's generation so that a dump that a commit
// cut into is read again), transactions (appending rules, removing rules
// by handle, removing tables) and the encoding of the few rule shapes
// meshwire writes, expression for expression as iptables-nft writes them
// (AddrMatch, Comment, NotMulticastDst, Masquerade, Counter). What the
// attributes mean (typed rules) is internal/firewall/fwnetlink's.
//
// Why not a tool: a firewall tool costs a process start and, for
// iptables-nft, a read of the whole table plus a generation-checked commit
// that is retried from scratch whenever another writer committed first;
// with 20 pods set up or torn down at once, most of the firewall work went
// there. A rule appended or removed by handle needs none of that.
//
// Why not github.com/google/nftables: it is slower on what the plugins do.
// BenchmarkCodecVsLibrary (codec_bench_kernel_test.go) runs both, with the same
// semantics, on one ADD's ipMasq rules (IPv4 + IPv6 appended in a nat
// POSTROUTING holding 100 other attachments), one DEL (find the
// attachment's rules by comment in both families, delete them by handle),
// a read of a chain holding 1,000 attachments' rules, and one ADD in a
// fresh process:
//
//	go test -run '^$' -bench CodecVsLibrary -benchtime 200x ./internal/nftnl/
//
// Decision rule: this package stays only if the library is at least 1.3
// times slower on add and on del (the per-pod costs), or lacks something
// the plugins need. Measured 2026-11-23, google/nftables v0.3.0, Linux
// 6.18, 2 shared CPUs, two runs of 200 iterations (means; p50 in brackets):
//
//	            codec ns/op       library ns/op       lib/codec  codec B, allocs  library B, allocs
//	add         499k [489k]   1.07M-1.89M [989k]   2.1-3.8    80.7k, 208       48.1k, 332
//	del         1.86M-1.97M   11.1M-16.1M [9.8M]   6.0-8.2    115k, 491        1.77M, 29,765
//	dump1000    9.5M-10.6M    54.7M-58.9M [50M]    5.2-6.2    206k, 2,082      8.97M, 156,740
//	fresh-add   508k-589k     1.27M [1.03M]        2.2-2.5    81k, 217         50k, 345
//
// What a plugin pays as a whole process, the criterion: one ADD or one DEL
// in a fresh process (fresh-add, fresh-del: the test binary started
// again, cold, as a runtime starts a plugin), timed as the process's wall
// time and inside it. Measured 2026-11-27, same machine, 100 of each,
// alternating (the machine about 2.5x slower than on 2026-11-23):
//
//	go test -tags kernel -run '^$' -bench 'CodecVsLibrary/fresh' -benchtime 100x ./internal/nftnl/
//
//	            process wall, codec / library    in the process, codec / library
//	fresh-add   18.1 ms / 19.4 ms (+1.3 ms)      0.57 ms / 1.92 ms (3.4x)
//	fresh-del   20.4 ms / 37.8 ms (+17.4 ms)     1.30 ms / 18.3 ms (14x)
//
// (the wall time includes this test binary's own start, about 17 ms; a
// plugin's start is a few ms). With the library a pod's DEL would pay
// 17 ms more: a bridge DEL took 39 ms on the same machine that day
// (BenchmarkBridge), so +45%; its ADD +1.3 ms (+3.5%). A program that
// only opens a connection is 1.71 MB stripped with this package and
// 2.02 MB with the library (go build -trimpath -ldflags='-s -w').
// Decision: this package stays.
//
// Besides speed, the library (v0.3.0) has no call for the ruleset
// generation (a consistent dump needs it), wraps the kernel's errors in
// dumps with %v (a missing chain is only told by the error's text), and
// asks an acknowledgement of every message of a transaction (each a copy
// of its request: large removals can overrun the socket). The library is
// a test-only dependency, for the benchmark.
//
// The rules appended are checked against iptables-nft itself: byte for
// byte against what iptables-nft-restore writes for the same line, and
// printed back as that line by `iptables-nft -S` and `iptables-nft-save` of
// every iptables-nft version tested (TestCodecRulesReadByIPTablesVersions;
// testdata/build-iptables.sh builds the versions beside the system's).
package nftnl
