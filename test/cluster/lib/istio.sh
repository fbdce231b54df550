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

# install_istio_cni: istio-cni's DaemonSet, rendered for the nodes'
# directories and checked (peers.sh), once the nodes are Ready on the
# base conflist; returns once istio-cni is chained on every node.
install_istio_cni() {
	local dirs d=$STATE/manifests/istio-cni
	[ "$NODES" -gt 1 ] || istio_base
	mkdir -p "$d"
	read -r -a dirs <<<"$(istio_node_conf)"
	HELM=$CACHE/helm/helm "$here/peers.sh" render sidecar "${dirs[0]}" "${dirs[1]}" >"$d/istio-cni.yaml"
	"$here/peers.sh" check "$d/istio-cni.yaml" | kc apply -f - >&2
	if [ "$NODES" = 1 ]; then wait_for "node $NODE_NAME Ready" 120 node_ready "$NODE_NAME" || die "node $NODE_NAME not Ready on $ISTIO_BASE_CONFLIST"; fi
	kc -n "$ISTIO_NS" rollout status ds/istio-cni-node --timeout=180s >&2
	wait_for "istio-cni chained into every node's conflist" 60 istio_chained || die "install-cni did not chain istio-cni into every node's conflist ($LOGS)"
}

# istio_drain: down's last step of the drain on this network: istio-cni's
# DaemonSet deleted after every other pod (as meshwire's is), and what its
# installer wrote on each node taken back: istio-cni out of the conflist,
# its binary and kubeconfig gone.
istio_drain() {
	kc delete ns "$ISTIO_NS" --ignore-not-found >/dev/null 2>&1 || true
	wait_for "namespace $ISTIO_NS gone" 120 istio_ns_gone || return 1
	local f bin
	while read -r f bin; do
		if grep -q '"istio-cni"' "$f"; then log "istio-cni's DaemonSet is gone, istio-cni is still in $f"; return 1; fi
		if [ -e "$bin/istio-cni" ] || ls "$(dirname "$f")"/*istio-cni-kubeconfig >/dev/null 2>&1; then
			log "istio-cni's DaemonSet is gone, its binary ($bin) or kubeconfig ($(dirname "$f")) is not"
			return 1
		fi
	done < <(istio_node_dirs)
}

istio_ns_gone() { ! kc get ns "$ISTIO_NS" >/dev/null 2>&1; }
