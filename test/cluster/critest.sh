#!/bin/bash
# critest.sh [meshwire|reference]...: cri-tools' critest (build.sh critest)
# runs its networking specs against a containerd of its own whose pods are
# wired by meshwire's plugins (bin/, `make build`) or, as the control, by
# the reference plugins v1.9.1, through one conflist: bridge mwc0,
# host-local, portmap, bandwidth. One run per argument, each with a fresh
# containerd and a full tear-down.
#
#   down    tear down what a killed run left
#
# The cluster's lifecycle pieces it needs (lib/common.sh: processes,
# containerd; lib/host.sh: the host's snapshot and tear-down) with a state
# directory, a network and a bridge of its own. A run holds the
# kernel-test lock (/run/meshwire-tests.lock), so it never runs beside the
# cluster (whose pod range 198.18.0.0/16 holds this one's) or `make test`;
# it builds before taking it. CRITEST_FOCUS replaces the Ginkgo focus
# (specs that need images build.sh does not make fail: nothing is pulled).
# Ginkgo's report and the logs go to
# $MESHWIRE_CRITEST_REPORT/PLUGINS (they outlive the tear-down).
set -euo pipefail

export MESHWIRE_CLUSTER_STATE=${MESHWIRE_CRITEST_STATE:-/var/lib/meshwire-critest}
LOG_PREFIX=critest
# shellcheck source-path=SCRIPTDIR source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"
# shellcheck source-path=SCRIPTDIR source=lib/host.sh
. "$lib/host.sh"
SOCK=$STATE/containerd/containerd.sock CNI_BIN=$STATE/cni/bin CNI_CONF=$STATE/cni/net.d

POD_CIDR=198.18.254.0/24 BRIDGE=mwc0 NETWORK=mwc-critest
CGROUP_PARENTS="k8s.io test.slice" # critest's pods: /test.slice (containerd 1.6 has no RuntimeConfig)
LOCK=/run/meshwire-tests.lock
REPORT=${MESHWIRE_CRITEST_REPORT:-/var/tmp/meshwire-critest}
FOCUS=${CRITEST_FOCUS:-'\[k8s\.io\] Networking'} # the networking specs
# How many specs the focus must run: 4 networking specs in critest v1.37.0
# (CRITEST_SPECS for another focus). Fewer, or any failure, fails the run.
SPECS=${CRITEST_SPECS:-4}
[ -z "${CRITEST_FOCUS:-}" ] || [ -n "${CRITEST_SPECS:-}" ] || SPECS=
HOST_PORT=12000 # the port mapping spec's
# What the plugins leave on the host is reported, then removed: their chains
# (iptables), their IPAM records.
CHAINS='(CNI|MW|MESHWIRE)-'

conflist() {
	cat <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$NETWORK",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}
    },
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "bandwidth", "capabilities": {"bandwidth": true}}
  ]
}
EOF
}

default_route_only() { case $(ip -4 route get "${POD_CIDR%.0/*}.1" 2>/dev/null) in *" via "* | "") ;; *) return 1 ;; esac; }

# run PLUGINS: one run, under the lock.
run() {
	local plugins=$1 src t0=$SECONDS
	case $plugins in
	meshwire) src=$repo/bin ;;
	reference) src=$CACHE/reference ;;
	esac
	[ -e "$STATE" ] && die "$STATE exists (a run that was killed?): run '$0 down' first"
	# (The cluster's down may still be removing its bridge.)
	wait_for "no route to $POD_CIDR but the default" 60 default_route_only ||
		die "a route to $POD_CIDR exists (the cluster's bridge?): $(ip -4 route get "${POD_CIDR%.0/*}.1")"
	ss -Hltn "sport = :$HOST_PORT" | grep -q . && die "port $HOST_PORT is in use"
	# make test's seed plays the reference portmap's chains: a reference
	# run would add to them, and the seed's removal would then fail.
	seeded && die "make test's host seed (test/seed-host.sh) is on this host: run when the tests are done"
	mkdir -p "$LOGS" "$RUN" "$CNI_BIN" "$CNI_CONF" "$REPORT/$plugins"
	trap 'st=$?; down; exit $st' EXIT
	snapshot_host
	chains "$CHAINS" >"$STATE/chains-before"
	ls /var/lib/cni/results >"$STATE/results-before" 2>/dev/null || :
	log "$plugins plugins from $src"
	for p in bridge host-local portmap bandwidth loopback; do cp "$src/$p" "$CNI_BIN/"; done
	conflist >"$CNI_CONF/10-$NETWORK.conflist"
	write_containerd_config "$STATE/config/containerd.toml" "$STATE/containerd" "$STATE/containerd/state" "$SOCK" \
		"$STATE/containerd/runc" "$CNI_BIN" "$CNI_CONF"
	start_containerd critest "$STATE/config/containerd.toml" "$SOCK"
	import_image_set "$SOCK" "$CACHE/images"

	log "critest --ginkgo.focus '$FOCUS' (log: $REPORT/$plugins/critest.log)"
	local st=0
	(cd "$REPORT/$plugins" && "$CACHE/bin/critest" --runtime-endpoint "unix://$SOCK" --image-endpoint "unix://$SOCK" \
		--report-dir "$REPORT/$plugins" --ginkgo.focus "$FOCUS" --ginkgo.no-color) >"$REPORT/$plugins/critest.log" 2>&1 || st=$?
	grep -E '^ *\[FAIL\]|^Ran [0-9]|^(SUCCESS|FAIL)!' "$REPORT/$plugins/critest.log" | sed "s/^/$plugins: /" >&2 || true
	specs_ran "$plugins" || st=1

	"$CTR" -a "$SOCK" -n k8s.io containers ls -q | grep -q . && { log "$plugins: critest left containers in containerd:"; "$CTR" -a "$SOCK" -n k8s.io containers ls >&2; st=1; }
	stop containerd
	# (The reference portmap leaves its chains: reported, not a failure.)
	leftovers "$plugins" || [ "$plugins" = reference ] || st=1
	cp "$LOGS/containerd.log" "$REPORT/$plugins/"
	trap - EXIT
	down
	log "$plugins: done in $((SECONDS - t0))s"
	return "$st"
}

# specs_ran PLUGINS: Ginkgo's summary says SPECS specs ran and passed (a
# focus that matches fewer, say after an upgrade of critest, fails).
specs_ran() {
	local ran passed
	ran=$(sed -n 's/^Ran \([0-9]*\) of .*/\1/p' "$REPORT/$1/critest.log")
	passed=$(sed -n 's/.*-- \([0-9]*\) Passed | \([0-9]*\) Failed.*/\1 \2/p' "$REPORT/$1/critest.log")
	if [ -n "$SPECS" ] && [ "$ran" != "$SPECS" ]; then
		log "$1: ran ${ran:-no} specs, want $SPECS"
		return 1
	fi
	if [ -z "$ran" ] || [ "$ran" = 0 ] || [ "$passed" != "$ran 0" ]; then
		log "$1: ${ran:-no} specs ran, passed and failed: ${passed:-no summary}"
		return 1
	fi
}

# leftovers: what the plugins' DEL left of the run's pods (all were
# removed through CRI by then): chains, libcni's cached results (of the
# network and containerd's loopback), the
# reference host-local's files of allocated addresses (meshwire's are in
# one database, whose DEL make test covers).
leftovers() {
	local left
	left=$({ chains "$CHAINS" | grep -vxFf "$STATE/chains-before" | sed 's/^/chain /'
		ls /var/lib/cni/results 2>/dev/null | grep -vxFf "$STATE/results-before" | sed 's/^/result /'
		ls "/var/lib/cni/networks/$NETWORK" 2>/dev/null | grep -E '^[0-9a-f.:]+$' | sed 's/^/address /'; } || true)
	[ -z "$left" ] && { log "$1: nothing left by the plugins' DEL"; return 0; }
	log "$1: left by the plugins' DEL: $(echo "$left" | tr '\n' ',')"
	return 1
}

down() {
	[ -d "$STATE" ] || return 0
	stop containerd
	remove_chains "$CHAINS" "$STATE/chains-before"
	release_host
	rm -rf --one-file-system "$STATE"
	log "torn down"
}

main() {
	[ "$(id -u)" = 0 ] || die "run as root"
	[ "${1:-}" = down ] && { down; exit; }
	local plugins=("${@:-meshwire}") p
	for p in "${plugins[@]}"; do
		case $p in meshwire | reference) ;; *) die "usage: $0 [meshwire|reference]... | down" ;; esac
	done
	if [ -z "${MESHWIRE_CRITEST_LOCKED:-}" ]; then
		"$repo/test/deps.sh" critest
		for p in "${plugins[@]}"; do
			[ "$p" != meshwire ] || [ -x "$repo/bin/bridge" ] || die "no $repo/bin/bridge: run make build"
		done
		CACHE=$("$here/build.sh" critest)
		log "waiting for $LOCK (the cluster, make test)"
		MESHWIRE_CRITEST_LOCKED=1 CACHE=$CACHE exec flock -w 3600 "$LOCK" "$0" "${plugins[@]}"
	fi
	local st=0
	for p in "${plugins[@]}"; do run "$p" || st=1; done
	return "$st"
}

main "$@"
