#!/bin/sh
# Runs meshwire's benchmarks for a make target (bench, bench-fastpath) and
# writes what they print to OUT too, between "meshwire-bench:" lines naming
# the target, the commit, whether the tree was clean, the dates, the
# machine and its load, the node's cached firewall backend (bridge's ipMasq
# and portmap use it when their config names none, and it moves their
# figures: docs/performance.md), the -bench pattern and the rounds of the
# fast-path and EBPF-mode benchmarks. test/bench/benchreport reads them
# (make bench-report, make bench-check).
#
#   test/bench/run.sh TARGET OUT PATTERN TIMEOUT
#
# GO and MESHWIRE_BIN_DIR come from the Makefile; MESHWIRE_BENCH_ROUNDS,
# when set, from the caller. Exits non-zero when go test does.
set -u
target=$1 out=$2 pattern=$3 timeout=$4
: "${GO:=go}"
{
	echo "meshwire-bench: target $target"
	echo "meshwire-bench: commit $(git rev-parse HEAD)"
	echo "meshwire-bench: tree $(test -z "$(git status --porcelain)" && echo clean || echo dirty)"
	echo "meshwire-bench: started $(date -u +%Y-%m-%dT%H:%M:%SZ)"
	echo "meshwire-bench: machine $(nproc) CPUs ($(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)), $(awk '/^MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), Linux $(uname -r)"
	echo "meshwire-bench: load at start $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "meshwire-bench: firewall backend $(cat /run/meshwire/firewall-backend 2>/dev/null || echo 'not detected yet')"
	echo "meshwire-bench: bench $pattern"
	echo "meshwire-bench: rounds ${MESHWIRE_BENCH_ROUNDS:-10}"
} | tee "$out"
{
	"$GO" test -tags kernel -count=1 -run '^$' -bench "$pattern" -benchtime 1x -timeout "$timeout" ./test/bench/... 2>&1
	echo "meshwire-bench: exit $?"
	echo "meshwire-bench: load at end $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "meshwire-bench: finished $(date -u +%Y-%m-%dT%H:%M:%SZ)"
} | tee -a "$out"
echo "raw output: $out"
grep -qx 'meshwire-bench: exit 0' "$out"
