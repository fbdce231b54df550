# shellcheck shell=bash
# common.sh: what the cluster's lifecycle scripts share (cluster.sh,
# critest.sh): the state directory, logging, the processes (start, stop,
# wait_for), the build cache. Sourced; defines only.

lib=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
here=$(cd "$lib/.." && pwd)
repo=$(cd "$here/../.." && pwd)
export PATH=/usr/local/go/bin:/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin

STATE=${MESHWIRE_CLUSTER_STATE:-/var/lib/meshwire-cluster}
PKI=$STATE/pki KCFG=$STATE/kubeconfig LOGS=$STATE/logs RUN=$STATE/run
ADMIN=$KCFG/admin.kubeconfig
CONTAINERD=/usr/bin/containerd CTR=/usr/bin/ctr RUNC=/usr/sbin/runc
SANDBOX_IMAGE=registry.k8s.io/pause:3.10.1 # images.sh builds it
# The e2e suite's leak snapshot as a command (test/snapshot, built by make
# build).
SNAPSHOT=$repo/bin/test/snapshot
# The node-wide lock of meshwire's kernel tests (internal/kerneltest).
TEST_LOCK=/run/meshwire-tests.lock

LOG_PREFIX=${LOG_PREFIX:-cluster}
log() { printf '%s %s: %s\n' "$(date -u +%T)" "$LOG_PREFIX" "$*" >&2; }
die() { log "error: $*"; exit 1; }
kc() { "$BIN/kubectl" --kubeconfig "$ADMIN" "$@"; }

# bin_dir sets BIN (and CACHE) from the build cache, building if needed.
bin_dir() {
	if [ -z "${BIN:-}" ]; then
		CACHE=$("$here/build.sh")
		BIN=$CACHE/bin
	else
		CACHE=$(dirname "$BIN")
	fi
}

# start NAME CMD...: run CMD in a session of its own, output to
# $LOGS/NAME.log, pid in $RUN/NAME.pid, command line in $RUN/NAME.cmd;
# without the caller's fd 3 (where `flock LOCK cmd` holds a lock) and 8
# (UP_LOCK), which the cluster's processes must not keep.
start() {
	local name=$1; shift
	log "starting $name"
	printf '%q ' "$@" >"$RUN/$name.cmd"
	setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null 3>&- 8>&- &
	echo $! >"$RUN/$name.pid"
}

alive() { [ -f "$RUN/$1.pid" ] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }

# stop NAME: SIGTERM, then SIGKILL after 20 s.
stop() {
	local name=$1 pid
	[ -f "$RUN/$name.pid" ] || return 0
	pid=$(cat "$RUN/$name.pid")
	if kill -0 "$pid" 2>/dev/null; then
		log "stopping $name (pid $pid)"
		# The kernel tests' lock as a group: while it waits, its flock
		# is a child that holds the lock once it gets it.
		[ "$name" != kernel-test-lock ] || kill -TERM -- "-$pid" 2>/dev/null || true
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
		kill -0 "$pid" 2>/dev/null && { log "$name still running: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; sleep 0.5; }
	fi
	rm -f "$RUN/$name.pid"
}

# wait_for WHAT SECONDS CMD...: retry CMD every second.
wait_for() {
	local what=$1 limit=$2; shift 2
	local t0=$SECONDS
	until "$@" >/dev/null 2>&1; do
		[ $((SECONDS - t0)) -lt "$limit" ] || { log "timed out after ${limit}s waiting for $what"; return 1; }
		sleep 1
	done
	log "$what after $((SECONDS - t0))s"
}

# seeded reports whether make test's host seed is there (test/seed-host.sh
# plays Docker, kube-proxy and portmap with rules commented meshwire-seed).
seeded() {
	{ iptables-save; ip6tables-save; iptables-legacy-save; } 2>/dev/null | grep -q meshwire-seed
}

# ---------------------------------------------------------------- containerd

# write_containerd_config FILE DIR STATE SOCKET RUNC_ROOT CNI_BIN CNI_CONF:
# containerd's config, its root DIR/root, from the template meshwire's CRI
# tests render too (test/cri/containerd.toml; test/cri's TestClusterConfig
# checks that both fill it alike): the local pause image, the CNI
# directories.
write_containerd_config() {
	mkdir -p "$(dirname "$1")"
	sed -e "s|@ROOT@|$2/root|g" \
		-e "s|@STATE@|$3|g" \
		-e "s|@SOCKET@|$4|g" \
		-e "s|@OPT@|$2/opt|g" \
		-e "s|@SANDBOX_IMAGE@|$SANDBOX_IMAGE|g" \
		-e "s|@RUNC@|$RUNC|g" \
		-e "s|@RUNC_ROOT@|$5|g" \
		-e "s|@CNI_BIN@|$6|g" \
		-e "s|@CNI_CONF@|$7|g" \
		"$repo/test/cri/containerd.toml" >"$1"
}

# import_image_set SOCKET DIR: the images images.sh made into DIR.
import_image_set() {
	local name file
	while read -r name file; do
		"$CTR" -a "$1" -n k8s.io images import --no-unpack "$2/$file" >/dev/null
	done <"$2/index"
}

# start_containerd NAME CONFIG SOCKET [PREFIX...]: the node's containerd.
# Every image is imported: a pull (an image the suite wants that images.sh
# does not make) goes to a closed local port and fails at once instead of
# leaving the machine (containerd honours the proxy variables for registry
# requests, and resolves no registry name). The CNI plugins it runs
# inherit its environment: NO_PROXY names the cluster's Service range and
# the API server's address (when set: cluster.sh's, not critest.sh's),
# so that a plugin with a Kubernetes client (istio-cni's GETs each pod
# from the kubernetes Service) reaches the API server, as on a node
# without a proxy.
start_containerd() {
	local name=$1 config=$2 sock=$3; shift 3
	local no_proxy=${SERVICE_CIDR:-}
	[ -z "${API_IP:-}" ] || no_proxy=${no_proxy:+$no_proxy,}$API_IP
	# (Its shim is found on PATH: the one built beside it first.)
	start "$(proc "$name" containerd)" "$@" env HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 NO_PROXY="$no_proxy" \
		PATH="$(dirname "$CONTAINERD"):$PATH" "$CONTAINERD" --config "$config"
	wait_for "containerd of $name" 30 "$CTR" -a "$sock" version
}

# proc NODE COMPONENT: the process name of a node's component (its pid,
# log and command files): the single node's keep their plain names.
proc() { if [ "${NODES:-1}" -gt 1 ]; then echo "$1.$2"; else echo "$2"; fi; }

# cluster_slot COMMAND: one cluster at a time on a host, and it is its own
# checkout's: up from another checkout (a worktree) waits until that cluster is down (up to
# MESHWIRE_CLUSTER_WAIT seconds, 7200), and down from another checkout
# refuses (MESHWIRE_CLUSTER_FORCE_DOWN=1 takes it down anyway). Each up
# holds $UP_LOCK while it waits and until it returns, so that two waiting
# ups do not both start (start() closes it for the cluster's processes).
UP_LOCK=/run/meshwire-cluster-up.lock
cluster_owner() { sed -n 's/^REPO=//p' "$STATE/settings" 2>/dev/null; }
cluster_slot() {
	if [ "$1" = up ]; then
		exec 8>"$UP_LOCK"
		flock -n 8 || { echo "cluster.sh: another up is under way or waiting ($UP_LOCK); waiting" >&2; flock 8; }
		if [ -n "$(cluster_owner)" ] && [ "$(cluster_owner)" != "$repo" ]; then
			echo "cluster.sh: the cluster at $STATE is $(cluster_owner)'s; waiting until it is down" >&2
			for _ in $(seq "$(( ${MESHWIRE_CLUSTER_WAIT:-7200} / 10 ))"); do [ -e "$STATE" ] || break; sleep 10; done
			[ ! -e "$STATE" ] || { echo "cluster.sh: $STATE still up after ${MESHWIRE_CLUSTER_WAIT:-7200} s" >&2; exit 1; }
		fi
	fi
	if [ "$1" = down ] && [ -n "$(cluster_owner)" ] && [ "$(cluster_owner)" != "$repo" ] && [ "${MESHWIRE_CLUSTER_FORCE_DOWN:-}" != 1 ]; then
		echo "cluster.sh: the cluster at $STATE is $(cluster_owner)'s, not this checkout's ($repo): it takes it down (MESHWIRE_CLUSTER_FORCE_DOWN=1 to force)" >&2
		exit 1
	fi
}
