#!/bin/bash
# perfblocks.sh record|stat OUTDIR BENCH ROUNDS LABEL...
#
# Profiles (perf record -a -g) or counts (perf stat -a) chosen timed blocks
# of the fast-path and capture benchmarks, on CPU 1 (the "one CPU"
# placement on two CPUs): one perf per LABEL ("PLACEMENT/CONFIGURATION/
# PATH/BYTES B", e.g. "one CPU/TPROXY/whole/64 B"), started disabled on the
# FIFOs the benchmark drives (MESHWIRE_BENCH_PERF_CTL,
# perfctl_bench_test.go), so that each records its block of every round
# and nothing else. BENCH is a -bench regexp, ROUNDS MESHWIRE_BENCH_ROUNDS.
# Run it from the repository root after `make build`; it takes the node's
# test lock itself. Output: OUTDIR/NAME.data (record) or OUTDIR/NAME.stat
# (stat), and OUTDIR/bench.log.
#
#	test/bench/perfblocks.sh record /tmp/prof '^BenchmarkFastpath$' 3 "one CPU/REDIRECT/whole/64 B" "one CPU/TPROXY/whole/64 B"
#	perf report -i /tmp/prof/one-cpu-tproxy-whole-64-b.data --children --sort sym
set -eu
mode=$1 out=$2 bench=$3 rounds=$4
shift 4
case $mode in record|stat) ;; *) echo "usage: $0 record|stat OUTDIR BENCH ROUNDS LABEL..." >&2; exit 2 ;; esac
[ -n "${MESHWIRE_KERNEL_LOCK_HELD:-}" ] || exec flock /run/meshwire-tests.lock env MESHWIRE_KERNEL_LOCK_HELD=1 "$0" "$mode" "$out" "$bench" "$rounds" "$@"
mkdir -p "$out"
ctl=$(mktemp -d)
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done
	for p in "${pids[@]}"; do wait "$p" || true; done
	rm -rf "$ctl"
}
trap cleanup EXIT
for label in "$@"; do
	name=$(printf '%s' "$label" | tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-//; s/-$//')
	mkfifo "$ctl/$name.ctl" "$ctl/$name.ack"
	c="fifo:$ctl/$name.ctl,$ctl/$name.ack"
	if [ "$mode" = record ]; then
		perf record -a -g -C 1 -F 20000 -D -1 --control "$c" -o "$out/$name.data" >"$out/$name.log" 2>&1 &
	else
		perf stat -a -C 1 -D -1 --control "$c" -o "$out/$name.stat" \
			-e task-clock,context-switches,raw_syscalls:sys_enter,sched:sched_wakeup,net:net_dev_queue,net:netif_receive_skb,sock:sk_data_ready \
			-e fib:fib_table_lookup -e fib:fib_table_lookup --filter 'tb_id == 133' >"$out/$name.log" 2>&1 &
	fi
	pids+=($!)
	echo "$label: $out/$name.$([ "$mode" = record ] && echo data || echo stat)"
done
sleep 2
MESHWIRE_BENCH_PERF_CTL=$ctl MESHWIRE_BENCH_ROUNDS=$rounds MESHWIRE_BIN_DIR=${MESHWIRE_BIN_DIR:-$PWD/bin} \
	go test -tags kernel -count=1 -run '^$' -bench "$bench" -benchtime 1x -timeout 60m ./test/bench/ >"$out/bench.log" 2>&1
