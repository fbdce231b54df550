# shellcheck shell=bash
# istio.sh: the cluster's third network, MESHWIRE_CLUSTER_CNI=istio-cni:
# the node's conflist that meshwire's cluster uses (bridge and host-local
# from meshwire's plugins, portmap, bandwidth; flannel's, delegating to
# them, on several nodes), with Istio's own istio-cni chained after it by
# Istio's own DaemonSet (install-cni), rendered from the chart of the
# pinned istio.io/istio module (peers.sh render sidecar). The binaries and
# images come from build.sh istio; each node's containerd imports the
# images as it imports the cluster's. meshwire's own DaemonSet does not
# run: istio-cni is the one that sets the pods' rules.
# Sourced by cluster.sh after common.sh and node.sh; defines only.

ISTIO_NS=istio-system
ISTIO_APP=istio-cni # the DaemonSet's pods' app.kubernetes.io/name
# The conflist the single node's istio-cni chains into: the network's own
# name, not meshwire's installer's 05-meshwire.conflist.
ISTIO_BASE_CONFLIST=05-mwk-cluster.conflist

# istio_build: istio-cni, install-cni, pilot-agent, helm and the images
# (build.sh istio: cached per pin).
istio_build() {
	log "build.sh istio (Istio's programs and images, cached)"
	"$here/build.sh" istio >/dev/null
}

# istio_images SOCKET: the images of build.sh istio into a node's
# containerd (localhost/istio/install-cni and proxyv2:meshwire-test), on
# the istio-cni network only.
istio_images() {
	[ "$CNI" = istio-cni ] || return 0
	import_image_set "$1" "$CACHE/istio-images"
}

# istio_node_conf: the directories of a node's CNI binaries and configs,
# as its kubelet's hostPath volumes see them: the state directory's for
# the single node, the node's own /opt/cni/bin and /etc/cni/net.d
# (nodens.sh) on several.
istio_node_conf() {
	if [ "$NODES" = 1 ]; then echo "$CNI_BIN $CNI_CONF"; else echo "/opt/cni/bin /etc/cni/net.d"; fi
}

# istio_node_dirs: "CONFLIST BIN_DIR" of every node, as the host sees
# them: the conflist istio-cni chains into, the directory it installs its
# binary into.
istio_node_dirs() {
	local name
	if [ "$NODES" = 1 ]; then echo "$CNI_CONF/$ISTIO_BASE_CONFLIST $CNI_BIN"; return; fi
	for name in $(node_names); do
		echo "$STATE/nodes/$name/fs/etc/cni/net.d/10-flannel.conflist $STATE/nodes/$name/fs/opt/cni/bin"
	done
}

# istio_base: one node: meshwire's plugins, installed with make install as
# a distribution would ship them, and the node's conflist
# (manifests/meshwire/cluster.conflist, at the runtime's cniVersion), which
# makes the node Ready. (Several: node_cni did the same with flannel's.)
istio_base() {
	make -s -C "$repo" install CNI_BIN_DIR="$CNI_BIN" BINDIR="$STATE/istio-cni/bin" >/dev/null
	node_conflist | sed "s/\"cniVersion\": \"[0-9.]*\"/\"cniVersion\": \"$(cni_version)\"/" >"$CNI_CONF/$ISTIO_BASE_CONFLIST"
	log "meshwire's plugins and $CNI_CONF/$ISTIO_BASE_CONFLIST installed"
}

# istio_chained: every node's conflist chains istio-cni (install-cni
# appends it to the plugins).
istio_chained() {
	local f _
	while read -r f _; do
		grep -q '"type": *"istio-cni"' "$f" || return 1
	done < <(istio_node_dirs)
}

# install_istio_cni: istio-cni's DaemonSet in sidecar mode, once the
# nodes are Ready on the base conflist (one node: its base installed
# first); returns once istio-cni is chained on every node.
install_istio_cni() {
	[ "$NODES" -gt 1 ] || istio_base
	istio_apply sidecar
}

# istio_apply sidecar|ambient: istio-cni's DaemonSet and what it needs,
# rendered from the chart in that mode for the nodes' directories,
# checked (peers.sh) and applied; returns once it is rolled out and
# istio-cni is chained on every node. On a running istio-cni cluster
# (cluster.sh istio-cni ambient) it is what `helm upgrade istio-cni
# --set profile=ambient` does: the DaemonSet's pods replaced, the old
# ones' shutdown an upgrade by Istio's reading (its DaemonSet stays), so
# that an ambient agent going back to sidecar leaves its host rules to
# down's clean-up.
istio_apply() {
	local mode=$1 dirs d=$STATE/manifests/istio-cni proc=
	mkdir -p "$d"
	read -r -a dirs <<<"$(istio_node_conf)"
	[ "$mode" != ambient ] || proc=$(istio_host_proc)
	ISTIO_HOST_PROC=$proc HELM=$CACHE/helm/helm "$here/peers.sh" render "$mode" "${dirs[0]}" "${dirs[1]}" >"$d/istio-cni-$mode.yaml"
	"$here/peers.sh" check "$d/istio-cni-$mode.yaml" | kc apply -f - >&2
	if [ "$NODES" = 1 ]; then wait_for "node $NODE_NAME Ready" 120 node_ready "$NODE_NAME" || die "node $NODE_NAME not Ready on $ISTIO_BASE_CONFLIST"; fi
	kc -n "$ISTIO_NS" rollout status ds/istio-cni-node --timeout=180s >&2
	wait_for "istio-cni chained into every node's conflist" 60 istio_chained || die "install-cni did not chain istio-cni into every node's conflist ($LOGS)"
	log "istio-cni's DaemonSet in $mode mode"
}

# istio_host_proc: the /proc that istio-cni's ambient agent is given (its
# DaemonSet's volume cni-host-procfs, the host's /proc in Istio's chart).
# The agent stats /host/proc/1/ns/net, the host's network namespace,
# before it starts (NewPodNetnsProcFinder: to tell pods' processes from
# the host's) and enters it there (ALLOW_SWITCH_TO_HOST_NS); PID 1 of
# these machines, the VM's init, is out of even root's reach (its ns/:
# permission denied), so the agent would exit. One node: a procfs of the
# host's PIDs under the state directory, with PID 2's entry (kthreadd,
# in the host's network namespace as PID 1 is) mounted on its 1; down
# unmounts it with the state directory's other mounts. Prints it.
istio_host_proc() {
	local p=$STATE/istio-cni/proc
	[ "$NODES" = 1 ] || die "istio-cni ambient: one node only (a node's PID 1 would be the host's, not its holder)"
	if ! mountpoint -q "$p/1"; then
		mkdir -p "$p"
		mountpoint -q "$p" || mount -t proc proc "$p"
		mount --bind /proc/2 "$p/1"
		log "$p: the host's /proc for istio-cni, PID 2's entry on its 1"
	fi
	echo "$p"
}

# istio_mode sidecar|ambient: cluster.sh istio-cni MODE, on a running
# istio-cni cluster.
istio_mode() {
	case ${1:-} in sidecar | ambient) ;; *) die "istio-cni: sidecar or ambient, not '${1:-}'" ;; esac
	[ -f "$STATE/settings" ] || die "istio-cni $1: no running cluster ($STATE)"
	[ "$CNI" = istio-cni ] || die "istio-cni $1: the running cluster's network is ${CNI}, not istio-cni"
	bin_dir
	istio_apply "$1"
}

# istio_drain: down's last step of the drain on this network: istio-cni's
# DaemonSet deleted after every other pod (as meshwire's is), then its
# namespace, and what its installer wrote on each node taken back:
# istio-cni out of the conflist, its binary and kubeconfig gone.
istio_drain() {
	# The agents' output while they stop (their clean-up), shown when
	# they leave something behind.
	local follow agents=$LOGS/istio-cni-node-stop.log
	kc -n "$ISTIO_NS" logs -f --prefix --tail=5 -l "app.kubernetes.io/name=$ISTIO_APP" >"$agents" 2>&1 &
	follow=$!
	# The DaemonSet first, as helm uninstall removes it: its agents, their
	# pods then deleted, find it gone and take back what they installed.
	# (An ambient agent that still finds its DaemonSet takes its stop for
	# an upgrade and leaves its plugin and rules to the next agent, which
	# a namespace's deletion can make it do: the pods may go first.)
	kc -n "$ISTIO_NS" delete ds istio-cni-node --ignore-not-found >/dev/null 2>&1 || true
	wait_for "istio-cni's agents gone" 120 istio_agents_gone || { kill "$follow" 2>/dev/null; return 1; }
	kc delete ns "$ISTIO_NS" --ignore-not-found >/dev/null 2>&1 || true
	wait_for "namespace $ISTIO_NS gone" 120 istio_ns_gone || { kill "$follow" 2>/dev/null; return 1; }
	kill "$follow" 2>/dev/null || true
	local f bin
	while read -r f bin; do
		if grep -q '"istio-cni"' "$f"; then
			log "istio-cni's DaemonSet is gone, istio-cni is still in $f; its agents' output as they stopped:"
			tail -n 40 "$agents" >&2
			return 1
		fi
		if [ -e "$bin/istio-cni" ] || ls "$(dirname "$f")"/*istio-cni-kubeconfig >/dev/null 2>&1; then
			log "istio-cni's DaemonSet is gone, its binary ($bin) or kubeconfig ($(dirname "$f")) is not"
			return 1
		fi
	done < <(istio_node_dirs)
}

istio_ns_gone() { ! kc get ns "$ISTIO_NS" >/dev/null 2>&1; }
istio_agents_gone() { [ -z "$(kc -n "$ISTIO_NS" get pods -l "app.kubernetes.io/name=$ISTIO_APP" -o name 2>/dev/null)" ]; }
