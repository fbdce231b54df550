#!/bin/bash
# cluster.sh up|down|env|status|node: a Kubernetes cluster whose network is
# meshwire, from binaries built from source (build.sh), in the shape of
# Kubernetes' hack/local-up-cluster.sh: every process's flags in lib/kube.sh,
# certificates and kubeconfigs made on the fly, one log and one pid file
# per process under the state directory, one tear-down. This file holds
# the cluster's lifecycle only; the suites that run against it are Go
# tests (suites/, `make cluster-smoke` and the others).
#
#   up      build (or reuse the cache); start the control plane on the
#           host, then the node(s); install the network; start CoreDNS
#   down    drain the pods (so that the CNI plugins' DEL runs), judge what
#           the plugins left on each node against its snapshot from before
#           the network was installed, stop every process, undo what the
#           cluster changed on the host, judge the host against its
#           snapshot from before up, remove the state directory
#   env     the shell lines that point kubectl at the cluster
#   status  the processes, the nodes and the pods
#   node kill|boot|remove NAME   a node's power cut, its power-on after
#           one, its removal for good (multi-node only)
#   control stop|start NAME   stop a control-plane process (kube-apiserver,
#           ...), or start it again as it was started (an API outage)
#   istio-cni sidecar|ambient   on an istio-cni cluster: its DaemonSet
#           rendered again in that mode and applied (lib/istio.sh)
#
# MESHWIRE_CLUSTER_NODES (make cluster NODES=N), 1 by default: one node on
# the host itself, its pods on the bridge mwk0, whose CNI config meshwire's
# installer writes (--conflist). With N >= 2, N nodes each in namespaces of
# its own (lib/nodens.sh, lib/node.sh) on an underlay bridge, the pods
# routed between them by flannel (flanneld v0.27.4 with the Kubernetes
# subnet manager, vxlan; MESHWIRE_CLUSTER_FLANNEL_BACKEND=host-gw), whose
# CNI plugin v0.9.1 delegates to the node's bridge and host-local;
# meshwire's DaemonSet, as shipped, chains intercept into flannel's
# conflist (--chain).
#
# MESHWIRE_CLUSTER_CNI=reference: the reference plugins v1.9.1 (bridge,
# host-local, portmap, bandwidth, loopback) in their place, the control.
# MESHWIRE_CLUSTER_CNI=istio-cni: Istio's istio-cni, built from the pinned
# istio.io/istio (build.sh istio) and installed by Istio's own DaemonSet,
# chained after the same conflist of meshwire's plugins (lib/istio.sh);
# meshwire's DaemonSet does not run: the peer of the sidecar comparisons.
#
# The nodes people run (make cluster RUNTIME=... PROXY_MODE=... FIREWALL=...):
#   MESHWIRE_CLUSTER_RUNTIME=containerd2: containerd v2.4.2 (build.sh
#     containerd2) instead of Debian's 1.6.20; the one node's conflist at
#     cniVersion 1.1.0, so that it calls the plugins' STATUS
#   MESHWIRE_CLUSTER_PROXY_MODE=nftables: kube-proxy in nftables mode
#   MESHWIRE_CLUSTER_FIREWALL=iptables|nftables: on one node, meshwire's
#     plugins (bridge's masquerade, portmap, intercept) forced to that
#     firewall backend instead of the one detected on the node
#   MESHWIRE_CLUSTER_INSTALL=helm: meshwire's DaemonSet installed with
#     `helm install meshwire conf/helm/meshwire -n kube-system` (helm
#     v3.19.0, build.sh helm) instead of kubectl apply, and removed at down
#     with `helm uninstall`; several nodes only (one node's DaemonSet is a
#     kustomization of the manifest); fortio's image (build.sh fortio) on
#     every node, for the mesh suite's load during `helm upgrade`
#   MESHWIRE_CLUSTER_FORTIO=1: fortio's image (build.sh fortio) on every
#     node whatever the install: the latency suite's client and server
#   MESHWIRE_CLUSTER_IP_FAMILY=dual: IPv4 and IPv6 pods, Services and
#     nodes (lib/ipfamily.sh); ipv4, the default, IPv4 only
#   MESHWIRE_CLUSTER_FROM=COMMIT: the nodes start on meshwire as it was at
#     COMMIT (its image, built from this repository's history, and its
#     manifest on several nodes), and the image that the mesh suite rolls
#     out is this tree's: an upgrade in place, old records and all
#   MESHWIRE_CLUSTER_POD_CGROUPS=1: one node only: kubelet makes its pod
#     cgroups (cgroupsPerQOS, kubepods/QOS/podUID/ in each hierarchy), as
#     kubelet does by default, instead of leaving every container in
#     containerd's k8s.io/ID; istio-cni's ambient agent finds a running
#     pod's network namespace by the pod's uid in its processes' cgroups
#
# No systemd: the processes are started with setsid and tracked by pid.
# No registry: every image is imported into containerd (images.sh).
set -euo pipefail

# shellcheck source-path=SCRIPTDIR source=lib/common.sh
. "$(dirname "$0")/lib/common.sh"
# shellcheck source-path=SCRIPTDIR source=lib/host.sh
. "$lib/host.sh"
# shellcheck source-path=SCRIPTDIR source=lib/kube.sh
. "$lib/kube.sh"
# shellcheck source-path=SCRIPTDIR source=lib/node.sh
. "$lib/node.sh"
# shellcheck source-path=SCRIPTDIR source=lib/istio.sh
. "$lib/istio.sh"
# shellcheck source-path=SCRIPTDIR source=lib/ipfamily.sh
. "$lib/ipfamily.sh"

NODES=${MESHWIRE_CLUSTER_NODES:-1}
[[ $NODES =~ ^[1-9]$ ]] || { echo "MESHWIRE_CLUSTER_NODES: 1 to 9, not '$NODES'" >&2; exit 2; }
CNI=${MESHWIRE_CLUSTER_CNI:-meshwire}
case $CNI in meshwire | reference | istio-cni) ;; *) echo "MESHWIRE_CLUSTER_CNI: meshwire, reference or istio-cni, not '$CNI'" >&2; exit 2 ;; esac
RUNTIME=${MESHWIRE_CLUSTER_RUNTIME:-containerd}
case $RUNTIME in containerd | containerd2) ;; *) echo "MESHWIRE_CLUSTER_RUNTIME: containerd or containerd2, not '$RUNTIME'" >&2; exit 2 ;; esac
PROXY_MODE=${MESHWIRE_CLUSTER_PROXY_MODE:-iptables}
case $PROXY_MODE in iptables | nftables) ;; *) echo "MESHWIRE_CLUSTER_PROXY_MODE: iptables or nftables, not '$PROXY_MODE'" >&2; exit 2 ;; esac
FIREWALL=${MESHWIRE_CLUSTER_FIREWALL:-}
case $FIREWALL in "" | iptables | nftables) ;; *) echo "MESHWIRE_CLUSTER_FIREWALL: iptables or nftables, not '$FIREWALL'" >&2; exit 2 ;; esac
INSTALL=${MESHWIRE_CLUSTER_INSTALL:-kubectl}
case $INSTALL in kubectl | helm) ;; *) echo "MESHWIRE_CLUSTER_INSTALL: kubectl or helm, not '$INSTALL'" >&2; exit 2 ;; esac
FORTIO=${MESHWIRE_CLUSTER_FORTIO:-}
case $FORTIO in "" | 0 | 1) ;; *) echo "MESHWIRE_CLUSTER_FORTIO: 1 or nothing, not '$FORTIO'" >&2; exit 2 ;; esac
IP_FAMILY=${MESHWIRE_CLUSTER_IP_FAMILY:-ipv4}
FROM=${MESHWIRE_CLUSTER_FROM:-}
case $IP_FAMILY in ipv4 | dual) ;; *) echo "MESHWIRE_CLUSTER_IP_FAMILY: ipv4 or dual, not '$IP_FAMILY'" >&2; exit 2 ;; esac
POD_CGROUPS=${MESHWIRE_CLUSTER_POD_CGROUPS:-0}
case $POD_CGROUPS in 0 | 1) ;; *) echo "MESHWIRE_CLUSTER_POD_CGROUPS: 0 or 1, not '$POD_CGROUPS'" >&2; exit 2 ;; esac
cluster_slot "${1:-}"
# A running cluster's own settings win (down, env, node).
if [ -f "$STATE/settings" ]; then
	# shellcheck source=/dev/null
	. "$STATE/settings"
fi

SERVICE_CIDR=198.19.0.0/16 # RFC 2544 test range
API_SERVICE_IP=198.19.0.1
DNS_SERVICE_IP=198.19.0.10
CLUSTER_DOMAIN=cluster.local
if [ "$NODES" = 1 ]; then
	POD_CIDR=198.18.0.0/16 NODE_CIDR_MASK=16 # RFC 2544 test range: the node's host-local range
	NODE_NAME=${NODE_NAME:-$(hostname | tr '[:upper:]' '[:lower:]')}
	# The node's IP: the IPv4 address of the default route's interface.
	# Nothing routes to it or adds it anywhere; the apiserver advertises it.
	NODE_IP=${NODE_IP:-$(ip -4 -o addr show dev "$(ip -4 route show default | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i+1); exit}}')" | awk '{split($4, a, "/"); print a[1]; exit}')}
	API_IP=$NODE_IP
else
	POD_CIDR=198.18.0.0/17 NODE_CIDR_MASK=24 # a /24 per node; the underlay above it
	API_IP=$HOST_UL_IP
fi
ipfamily_addresses # POD_CIDRS, SERVICE_CIDRS; the IPv6 ones in dual stack
BRIDGE=mwk0 NETWORK=mwk-cluster # manifests/meshwire/cluster.conflist's (one node)
SOCK=$STATE/containerd/containerd.sock CNI_BIN=$STATE/cni/bin CNI_CONF=$STATE/cni/net.d

# The control plane's processes, in the order up starts them (down stops
# them in reverse); the single node's follow them.
CONTROL="kernel-test-lock etcd kube-apiserver kube-controller-manager kube-scheduler"
HOST_NODE="containerd kubelet kube-proxy"

# hold_test_lock: a process that holds the kernel tests' lock until down
# stops it; up waits for running kernel tests first, as they wait for
# each other (up to an hour): their leak checks would see the cluster's
# pods come and go, and make test's host seed would become kube-proxy's.
hold_test_lock() {
	flock -n "$TEST_LOCK" true || log "waiting for meshwire's kernel tests (make test, bench or chaos) to release $TEST_LOCK"
	start kernel-test-lock bash -c 'exec 9>"$1" && flock -w 3600 9 && touch "$2" && exec sleep infinity' lock "$TEST_LOCK" "$RUN/kernel-test-lock.held"
	wait_for "the kernel tests' lock" 3600 test -e "$RUN/kernel-test-lock.held" || die "could not take $TEST_LOCK"
}

# guard [PREFIX...]: a packet to the service range that kube-proxy did not
# DNAT (an address no Service has, a stale DNS answer) would follow a route
# off the node; MWK-GUARD rejects it instead, for pods (FORWARD) and the
# node (OUTPUT).
guard() {
	"$@" iptables -N MWK-GUARD
	"$@" iptables -A MWK-GUARD -d "$SERVICE_CIDR" -m conntrack ! --ctstate DNAT \
		-m comment --comment "meshwire cluster: no Service at this address" -j REJECT
	"$@" iptables -I FORWARD 1 -j MWK-GUARD
	"$@" iptables -I OUTPUT 1 -j MWK-GUARD
	ipfamily_guard "$@"
}

# ------------------------------------------------------------------ meshwire

# meshwire_images: meshwire's image, built from this tree the way a user
# builds it (make image); the same image under a second tag, the "new
# version" the mesh suite rolls out (with FROM, latest is FROM's image and
# only rollout is this tree's); the test proxy (test/proxy), the
# sidecar of the suites' pods; saved as one archive, $STATE/images.tar,
# that each node's containerd imports.
meshwire_images() {
	local old
	if [ -n "$FROM" ]; then
		old=$STATE/from-src
		log "make image at $FROM (the nodes' first meshwire, log: $LOGS/make-image-from.log)"
		mkdir -p "$old"
		git -C "$repo" archive "$FROM" | tar -x -C "$old"
		make -C "$old" image VERSION="${FROM:0:12}" >"$LOGS/make-image-from.log" 2>&1 || { tail -20 "$LOGS/make-image-from.log" >&2; die "make image at $FROM failed"; }
	fi
	log "make image (meshwire's image, log: $LOGS/make-image.log)"
	make -C "$repo" image >"$LOGS/make-image.log" 2>&1 || { tail -20 "$LOGS/make-image.log" >&2; die "make image failed"; }
	podman tag localhost/meshwire:latest localhost/meshwire:rollout
	if [ -n "$FROM" ]; then
		podman tag "localhost/meshwire:${FROM:0:12}" localhost/meshwire:latest
		rm -rf "$old"
	fi
	local root=$STATE/testproxy-root
	mkdir -p "$root"
	cp "$repo/bin/test/proxy" "$root/proxy"
	tar -C "$root" -c . | podman import --quiet - localhost/meshwire-testproxy:latest >/dev/null
	rm -rf "$root"
	podman save --quiet --multi-image-archive --format docker-archive -o "$STATE/images.tar" \
		localhost/meshwire:latest localhost/meshwire:rollout localhost/meshwire-testproxy:latest
}

# install_meshwire: one node: the DaemonSet of conf/kubernetes, unchanged,
# through a kustomization (manifests/meshwire) that points its host paths
# into the state directory and makes meshwire write the node's only CNI
# config itself. Several: the DaemonSet as shipped, which chains
# intercept into flannel's conflist on every node; with INSTALL=helm, the
# chart it is rendered from, with its default values, as a release.
install_meshwire() {
	if [ "$INSTALL" = helm ]; then
		hc install meshwire "$repo/conf/helm/meshwire" -n kube-system >&2
		return
	fi
	local d=$STATE/manifests/meshwire
	mkdir -p "$d"
	# With FROM, the manifest of that commit (the flags its agent knows).
	if [ -n "$FROM" ]; then
		git -C "$repo" show "$FROM:conf/kubernetes/daemonset.yaml" >"$d/daemonset.yaml"
	else
		cp "$repo/conf/kubernetes/daemonset.yaml" "$d/daemonset.yaml"
	fi
	if [ "$NODES" -gt 1 ]; then
		kc apply -f "$d/daemonset.yaml" >&2
		return
	fi
	node_conflist >"$d/cluster.conflist"
	# (With FIREWALL, the conflist has its own intercept entry.)
	sed -e "s#@STATE@#$STATE#g" -e "s#@POD_CIDR@#$POD_CIDR#g" -e "s#@CNI_VERSION@#$(cni_version)#g" \
		${FIREWALL:+-e '/- --intercept$/d'} "$here/manifests/meshwire/kustomization.yaml" >"$d/kustomization.yaml"
	ipfamily_kustomization "$d/kustomization.yaml"
	kc apply -k "$d" >&2
	wait_for "meshwire's conflist in $CNI_CONF" 120 ls "$CNI_CONF/05-meshwire.conflist"
}

# hc: helm (build.sh helm's) on the cluster, its own files under the state
# directory; the suites run it the same way (framework.Cluster.Helm).
hc() {
	HELM_CONFIG_HOME=$STATE/helm/config HELM_CACHE_HOME=$STATE/helm/cache HELM_DATA_HOME=$STATE/helm/data \
		"$(dirname "$BIN")/helm/helm" --kubeconfig "$ADMIN" "$@"
}

# fortio_images SOCKET: fortio's image (build.sh fortio) into a node's
# containerd, with INSTALL=helm (the mesh suite's load during the
# upgrade) or FORTIO=1 (the latency suite's pods).
with_fortio() { [ "$INSTALL" = helm ] || [ "$FORTIO" = 1 ]; }
fortio_images() {
	with_fortio || return 0
	import_image_set "$1" "$CACHE/fortio-images"
}

# install_reference: one node: the control network, the reference plugins
# v1.9.1 with the same conflist, written where meshwire's installer writes
# its own.
install_reference() {
	local p
	for p in bridge host-local portmap bandwidth loopback; do
		install -m 0755 "$CACHE/reference/$p" "$CNI_BIN/$p"
	done
	node_conflist | sed "s/\"cniVersion\": \"[0-9.]*\"/\"cniVersion\": \"$(cni_version)\"/" >"$CNI_CONF/05-reference.conflist"
	log "reference plugins v1.9.1 and $CNI_CONF/05-reference.conflist installed"
}

# cni_version: the one node's conflist's cniVersion: 1.0.0, the newest
# containerd 1.6 reads; 1.1.0 on containerd 2, which then calls STATUS.
cni_version() { if [ "$RUNTIME" = containerd2 ]; then echo 1.1.0; else echo 1.0.0; fi; }

# node_conflist: the one node's conflist (manifests/meshwire), with
# meshwire's plugins forced to FIREWALL's backend when it is set (bridge's
# ipMasqBackend, portmap's backend; intercept's, iptables-backend, through
# an entry of its own instead of the installer's --intercept), and
# host-local's IPv6 range in dual stack.
node_conflist() { node_conflist_firewall | ipfamily_conflist; }
node_conflist_firewall() {
	local f=$here/manifests/meshwire/cluster.conflist
	if [ -z "$FIREWALL" ]; then cat "$f"; return; fi
	local ipt=$FIREWALL
	[ "$ipt" = iptables ] && ipt=iptables-nft
	sed -e "s|\"ipMasq\": true,|\"ipMasq\": true, \"ipMasqBackend\": \"$FIREWALL\",|" \
		-e "s|{\"type\": \"portmap\", |{\"type\": \"portmap\", \"backend\": \"$FIREWALL\", |" \
		-e "s|{\"type\": \"bandwidth\", \"capabilities\": {\"bandwidth\": true}}|&,\n    {\"type\": \"intercept\", \"iptables-backend\": \"$ipt\", \"capabilities\": {\"io.kubernetes.cri.pod-annotations\": true}, \"istio-service-cidr\": \"*\", \"istio-inbound-ports\": \"*\", \"istio-local-exclude-ports\": \"15020\", \"istio-local-outbound-ports-exclude\": \"15020\", \"log\": {\"file\": \"$STATE/meshwire/log/cni.log\"}}|" "$f"
}

# kube_proxy_synced [PREFIX...]: kube-proxy's first sync (the kubernetes
# Service's rule, in its iptables chains or its nftables table) in the node
# PREFIX runs in.
kube_proxy_synced() {
	if [ "$PROXY_MODE" = nftables ]; then
		"$@" nft list table ip kube-proxy 2>/dev/null | grep -q 'default/kubernetes/tcp/https'
	else
		"$@" iptables -t nat -S KUBE-SERVICES 2>/dev/null | grep -q 'default/kubernetes:https'
	fi
}

node_ready() {
	[ "$(kc get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

# ------------------------------------------------------------------- up

up() {
	[ "$(id -u)" = 0 ] || die "run as root"
	local c
	for c in $CONTROL $HOST_NODE; do alive "$c" && die "$c is running already ($STATE); run '$0 down' first"; done
	[ -e "$STATE" ] && die "$STATE exists (a cluster that was not taken down?); run '$0 down' first"
	for c in ${ETCD_CLIENT##*:} ${ETCD_PEER##*:} $API_PORT 10248 10250 10256 10257 10259; do
		ss -Hltn "sport = :$c" | grep -q . && die "port $c is in use"
	done
	seeded && die "make test's host seed (test/seed-host.sh, comment meshwire-seed) is on this host: its kube-proxy-style KUBE-* chains would become kube-proxy's; start the cluster when the tests are done"
	local t0=$SECONDS
	"$repo/test/deps.sh" cluster
	bin_dir
	[ "$CNI" != reference ] || "$here/build.sh" reference >/dev/null
	[ "$CNI" != istio-cni ] || istio_build
	[ "$NODES" = 1 ] || "$here/build.sh" flannel >/dev/null
	if [ "$RUNTIME" = containerd2 ]; then
		"$here/build.sh" containerd2 >/dev/null
		CONTAINERD=$CACHE/containerd2/containerd CTR=$CACHE/containerd2/ctr
	fi
	[ -z "$FIREWALL" ] || [ "$NODES" = 1 ] || die "MESHWIRE_CLUSTER_FIREWALL: one node only (flannel writes the nodes' conflist)"
	[ "$POD_CGROUPS" = 0 ] || [ "$NODES" = 1 ] || die "MESHWIRE_CLUSTER_POD_CGROUPS: one node only (not tried in the nodes' cgroup namespaces)"
	if [ "$INSTALL" = helm ]; then
		[ "$NODES" -gt 1 ] || die "MESHWIRE_CLUSTER_INSTALL=helm: several nodes only (NODES >= 2), where the chart is installed as shipped; one node's DaemonSet is a kustomization of the manifest"
		[ "$CNI" = meshwire ] || die "MESHWIRE_CLUSTER_INSTALL=helm: meshwire's network only, not $CNI"
		"$here/build.sh" helm >/dev/null
	fi
	! with_fortio || "$here/build.sh" fortio >/dev/null
	ipfamily_check
	if [ -n "$FROM" ]; then
		[ "$CNI" = meshwire ] && [ "$INSTALL" = kubectl ] || die "MESHWIRE_CLUSTER_FROM: meshwire's network installed with kubectl only"
		FROM=$(git -C "$repo" rev-parse --verify -q "$FROM^{commit}") || die "MESHWIRE_CLUSTER_FROM: no commit $MESHWIRE_CLUSTER_FROM in $repo"
	fi
	log "binaries: $BIN; $NODES node(s) on $RUNTIME, kube-proxy in $PROXY_MODE mode, pods wired by $CNI${FIREWALL:+ forced to $FIREWALL}, installed with $INSTALL, $IP_FAMILY (pods $POD_CIDRS, Services $SERVICE_CIDRS)$([ "$POD_CGROUPS" = 0 ] || echo ", kubelet's pod cgroups")"
	log "make build (log: /tmp/meshwire-cluster-make-build.log)"
	make -C "$repo" build >/tmp/meshwire-cluster-make-build.log 2>&1 || die "make build failed: /tmp/meshwire-cluster-make-build.log"
	mkdir -p "$PKI" "$KCFG" "$LOGS" "$RUN" "$STATE/config"
	trap '[ $? = 0 ] || log "up failed: the logs are in $LOGS; $0 down cleans up"' EXIT
	printf 'FROM=%q\nREPO=%q\nBIN=%q\nCNI=%q\nNODES=%q\nRUNTIME=%q\nCONTAINERD=%q\nCTR=%q\nPROXY_MODE=%q\nFIREWALL=%q\nINSTALL=%q\nFORTIO=%q\nIP_FAMILY=%q\nPOD_CGROUPS=%q\n' \
		"$FROM" "$repo" "$BIN" "$CNI" "$NODES" "$RUNTIME" "$CONTAINERD" "$CTR" "$PROXY_MODE" "$FIREWALL" "$INSTALL" "$FORTIO" "$IP_FAMILY" "$POD_CGROUPS" >"$STATE/settings"
	hold_test_lock
	snapshot_host
	"$SNAPSHOT" save "$STATE/host-before.json"
	make_pki
	[ "$CNI" = reference ] || meshwire_images

	[ "$NODES" = 1 ] || underlay_up # the API server's address is on it
	start_etcd
	start_apiserver
	wait_for "kube-apiserver ready" 90 kc get --raw /readyz
	start_controller_manager
	start_scheduler
	if [ "$NODES" = 1 ]; then up_host_node; else up_nodes; fi

	log "CoreDNS"
	kc apply -f "$here/manifests/coredns.yaml" >&2
	kc -n kube-system rollout status deploy/coredns --timeout=180s >&2
	write_description
	trap - EXIT
	log "cluster up in $((SECONDS - t0))s"
	kc get nodes -o wide >&2
	kc get pods -A -o wide >&2
	echo >&2
	env_lines >&2
}

# up_host_node: the single node, on the host itself.
up_host_node() {
	mkdir -p "$STATE/containerd" "$CNI_BIN" "$CNI_CONF"
	node_pki "$NODE_NAME" "$NODE_IP"
	write_containerd_config "$STATE/config/containerd.toml" "$STATE/containerd" "$STATE/containerd/state" "$SOCK" \
		"$STATE/containerd/runc" "$CNI_BIN" "$CNI_CONF"
	kubelet_config "$STATE/config/kubelet.yaml" "$SOCK" "$NODE_IP" "$NODE_NAME"
	kube_proxy_config "$STATE/config/kube-proxy.yaml" "$NODE_NAME"
	start_containerd "$NODE_NAME" "$STATE/config/containerd.toml" "$SOCK"
	import_image_set "$SOCK" "$CACHE/images"
	istio_images "$SOCK"
	fortio_images "$SOCK"
	[ ! -f "$STATE/images.tar" ] || "$CTR" -a "$SOCK" -n k8s.io images import --no-unpack "$STATE/images.tar" >/dev/null
	start_kubelet "$NODE_NAME" "$NODE_IP" "$STATE/config/kubelet.yaml" "$STATE/kubelet"
	start_kube_proxy "$NODE_NAME" "$STATE/config/kube-proxy.yaml"
	guard
	wait_for "node $NODE_NAME registered" 90 kc get node "$NODE_NAME"
	if node_ready "$NODE_NAME"; then die "node $NODE_NAME is Ready before a CNI config was written"; fi
	# kube-proxy's first sync, then a snapshot that waits until two a
	# second apart agree (its other family).
	wait_for "kube-proxy's rules" 60 kube_proxy_synced
	"$SNAPSHOT" save "$STATE/network-before.json"
	log "node $NODE_NAME registered, NotReady (no CNI config yet): installing $CNI"
	install_"${CNI//-/_}"
	wait_for "node $NODE_NAME Ready" 120 node_ready "$NODE_NAME"
	[ "$CNI" != meshwire ] || kc -n kube-system rollout status ds/meshwire-node --timeout=120s >&2
}

# up_nodes: NODES nodes in namespaces of their own, flannel between them.
up_nodes() {
	local i name
	flannel_setup
	mkdir -p "$STATE/nodes"
	for i in $(seq "$NODES"); do
		name=mwk-node$i
		node_new "$name" "$UNDERLAY_PREFIX.$((10 + i))"
		node_boot "$name"
		node_start "$name"
	done
	for name in $(node_names); do
		wait_for "node $name registered" 90 kc get node "$name"
		node_flannel "$name"
	done
	for name in $(node_names); do
		node "$name"
		wait_for "flannel's routes on $N to every other node" 60 flannel_converged "$N" || die "flannel did not converge on $N"
		if node_ready "$N"; then die "node $N is Ready before a CNI config was written"; fi
		wait_for "kube-proxy's rules on $N" 60 kube_proxy_synced "${NX[@]}"
		"${NX[@]}" "$SNAPSHOT" save "$ND/network-before.json"
		log "node $N registered, NotReady (no CNI config yet): installing $CNI's plugins and flannel's conflist"
		node_cni "$N"
	done
	for name in $(node_names); do wait_for "node $name Ready" 120 node_ready "$name"; done
	if [ "$CNI" = meshwire ]; then
		install_meshwire
		kc -n kube-system rollout status ds/meshwire-node --timeout=180s >&2
		for name in $(node_names); do
			node "$name"
			wait_for "intercept chained into $N's conflist" 60 grep -q '"intercept"' "$ND/fs/etc/cni/net.d/10-flannel.conflist"
		done
	fi
	[ "$CNI" != istio-cni ] || install_istio_cni
}

# write_description: $STATE/cluster.json, what the suites (suites/) know
# of the cluster: its nodes, where the host sees each node's files, how to
# run a command in each.
write_description() {
	local name first=1
	{
		printf '{"state":"%s","bin":"%s","repo":"%s","kubeconfig":"%s","cni":"%s","runtime":"%s","proxyMode":"%s","firewall":"%s","install":"%s","from":"%s","fortio":%s,"ipFamily":"%s","podCgroups":%s,"podCIDR":"%s","serviceCIDR":"%s","podCIDR6":"%s","serviceCIDR6":"%s","apiIP":"%s","nodes":[' \
			"$STATE" "$BIN" "$repo" "$ADMIN" "$CNI" "$RUNTIME" "$PROXY_MODE" "$FIREWALL" "$INSTALL" "$FROM" "$(with_fortio && echo true || echo false)" "$IP_FAMILY" "$([ "$POD_CGROUPS" = 1 ] && echo true || echo false)" "$POD_CIDR" "$SERVICE_CIDR" "$POD_CIDR6" "$SERVICE_CIDR6" "$API_IP"
		if [ "$NODES" = 1 ]; then
			printf '{"name":"%s","ip":"%s","pluginLog":"%s","varLibCNI":"/var/lib/cni","criSocket":"%s","runtimeLog":"%s","enter":[]}' \
				"$NODE_NAME" "$NODE_IP" "$STATE/meshwire/log/cni.log" "$SOCK" "$LOGS/containerd.log"
		else
			for name in $(node_names); do
				node "$name"
				[ "$first" = 1 ] || printf ','
				first=0
				printf '{"name":"%s","ip":"%s","dir":"%s","pluginLog":"%s","varLibCNI":"%s","criSocket":"%s","runtimeLog":"%s","enter":["%s","enter","%s"]}' \
					"$N" "$NIP" "$ND" "$ND/fs/var/log/meshwire/cni.log" "$ND/fs/var/lib/cni" "$NSOCK" "$LOGS/$N.containerd.log" "$lib/nodens.sh" "$ND"
			done
		fi
		printf ']}\n'
	} >"$STATE/cluster.json"
}

env_lines() {
	bin_dir
	echo "export KUBECONFIG=$ADMIN"
	echo "export PATH=$BIN:\$PATH"
}

# ------------------------------------------------------------------- down

# drain: delete every pod (the network's DaemonSet's last, meshwire's or
# istio-cni's, so that the plugins it configured run DEL for the others)
# and wait until kubelet has stopped their sandboxes, which runs the CNI
# DEL. Fails when any of it does not happen: what the plugins left can
# then not be judged.
drain() {
	kc get --raw /readyz >/dev/null 2>&1 || { log "apiserver not answering: no drain"; return 1; }
	log "draining the node(s)"
	local ns keep=kube-system
	[ "$CNI" != istio-cni ] || keep=$ISTIO_NS
	for ns in $(kc get ns -o jsonpath='{.items[*].metadata.name}'); do
		case $ns in default | kube-system | kube-public | kube-node-lease | "$keep") ;;
		*) kc delete ns "$ns" --wait=false >/dev/null ;;
		esac
	done
	for ns in default kube-system; do
		kc -n "$ns" delete deploy,rs,sts,job,svc -l 'app.kubernetes.io/name!=meshwire' --ignore-not-found >/dev/null 2>&1 || true
		kc -n "$ns" delete ds -l 'app.kubernetes.io/name!=meshwire' --ignore-not-found >/dev/null 2>&1 || true
		kc -n "$ns" delete pod -l 'app.kubernetes.io/name!=meshwire' --wait=false >/dev/null 2>&1 || true
	done
	wait_for "pods other than the network's gone" 180 only_network_left || return 1
	if [ "$INSTALL" = helm ]; then
		# The release's removal is the DaemonSet's: its pods first
		# (foreground), then the DaemonSet, its RBAC and the release.
		log "helm uninstall meshwire"
		hc uninstall meshwire -n kube-system --cascade foreground --wait --timeout 120s >&2 || return 1
		wait_for "meshwire's agent pods gone" 120 no_agent_pods || return 1
	else
		kc -n kube-system delete ds meshwire-node --ignore-not-found >/dev/null 2>&1 || true
	fi
	[ "$CNI" != istio-cni ] || istio_drain || return 1
	wait_for "every pod gone" 60 no_pods || return 1
	wait_for "every sandbox stopped" 60 no_ready_sandbox || return 1
	# Deleting the DaemonSet took back what its installer wrote.
	if [ "$NODES" = 1 ]; then
		if [ -e "$CNI_CONF/05-meshwire.conflist" ]; then log "meshwire's DaemonSet is gone, its conflist is not"; return 1; fi
	else
		local name
		for name in $(node_names); do
			if grep -q '"intercept"' "$STATE/nodes/$name/fs/etc/cni/net.d/10-flannel.conflist"; then
				log "meshwire's DaemonSet is gone, intercept is still in $name's conflist"
				return 1
			fi
		done
	fi
}

# only_network_left: no pod left but the network's DaemonSet's (meshwire's,
# istio-cni's).
only_network_left() {
	[ -z "$(kc get pods -A -o jsonpath='{range .items[*]}{.metadata.labels.app\.kubernetes\.io/name}{"|"}{.metadata.name}{"\n"}{end}' | grep -Ev "^(meshwire|$ISTIO_APP)\|")" ]
}
no_pods() { [ -z "$(kc get pods -A -o name)" ]; }
no_agent_pods() { [ -z "$(kc -n kube-system get pods -l app.kubernetes.io/name=meshwire -o name)" ]; }
# no_ready_sandbox: ctr lists the sandboxes' pause tasks of every node:
# none running any more.
no_ready_sandbox() {
	local s
	for s in $(node_sockets); do
		! "$CTR" -a "$s" -n k8s.io tasks ls 2>/dev/null | awk 'NR > 1 && $3 == "RUNNING"' | grep -q . || return 1
	done
}
node_sockets() {
	if [ "$NODES" = 1 ]; then echo "$SOCK"; else node_names | sed "s|.*|$STATE/nodes/&/containerd.sock|"; fi
}

# check_leaks NAME SNAPSHOT BRIDGE ALLOW [PREFIX...]: the node (PREFIX runs
# in it) against SNAPSHOT, allowing what the bridge plugin keeps by design
# on BRIDGE (test/snapshot -bridge) and the differences the regular
# expression ALLOW matches (when not empty), judging only the network namespaces the
# cluster names (containerd's cni-*, the nodes'; others are other tools');
# the differences go to the log and to $LOGS/leaks-NAME.txt. A missing
# snapshot is a failure: nothing judged.
check_leaks() {
	local name=$1 snap=$2 bridge=$3 allow=$4; shift 4
	if [ ! -f "$snap" ]; then
		log "leak check ($name) FAILED: no snapshot $snap to judge against"
		LEAKS=1
		return
	fi
	if "$@" "$SNAPSHOT" check "$snap" ${bridge:+-bridge "$bridge"} ${allow:+-allow "$allow"} -netns '^(cni-|mwk-node)' -wait 60s >"$LOGS/leaks-$name.txt" 2>&1; then
		log "leak check ($name): matches its snapshot"
	else
		log "leak check ($name) FAILED:"
		sed 's/^/    /' "$LOGS/leaks-$name.txt" >&2
		LEAKS=1
	fi
}

# network_leaks: after the drain, each node against its snapshot from
# before its network was installed. With meshwire, any difference fails
# down; the reference plugins' (the control's) are listed, not judged:
# they keep their portmap chains and host-local files by design.
network_leaks() {
	local report=${MESHWIRE_CLUSTER_E2E_REPORT:-/var/tmp/meshwire-cluster-e2e} name saved=$LEAKS
	if [ "$NODES" = 1 ]; then
		check_leaks "$CNI" "$STATE/network-before.json" "$BRIDGE" ""
		[ "$CNI" = reference ] || check_probe_sets
	else
		# The routes flannel had to nodes removed since (node remove).
		local gone=""
		[ ! -f "$STATE/removed-cidrs" ] || gone=$(sed 's/\./\\./g; s|.*|^routes: removed ".* Dst: & .*"$|' "$STATE/removed-cidrs" | paste -sd'|')
		for name in $(node_names); do
			node "$name"
			check_leaks "$CNI-$N" "$ND/network-before.json" cni0 "$gone" "${NX[@]}"
		done
	fi
	if [ "$CNI" = reference ]; then
		[ "$LEAKS" = "$saved" ] || log "(the control: what the reference plugins left is theirs by design, listed above; down removes it)"
		mkdir -p "$report" && cat "$LOGS"/leaks-reference*.txt >"$report/leaks-reference.txt" 2>/dev/null || true
		LEAKS=$saved
	fi
}

down() {
	[ "$(id -u)" = 0 ] || die "run as root"
	[ -d "$STATE" ] || { log "no cluster at $STATE"; return 0; }
	local t0=$SECONDS c name
	LEAKS=0
	BIN=${BIN:-}
	if [ -n "$BIN" ] && [ -x "$BIN/kubectl" ] && drain; then
		network_leaks
	else
		log "the node(s) were not drained: the plugins' DEL cannot be judged"
		LEAKS=1
	fi
	if [ "$NODES" = 1 ]; then
		for c in $(echo "$HOST_NODE" | tr ' ' '\n' | tac); do stop "$c"; done
	else
		for name in $(node_names); do node_stop "$name"; done
	fi
	for c in $(echo "$CONTROL" | tr ' ' '\n' | tac); do
		# The kernel tests' lock goes last, after the host's leak check.
		[ "$c" = kernel-test-lock ] || stop "$c"
	done
	# kube-proxy's own clean-up of its rules, then anything KUBE- left
	# (kubelet's canary chains).
	if [ "$NODES" = 1 ] && [ -n "$BIN" ] && [ -x "$BIN/kube-proxy" ] && ! seeded; then
		"$BIN/kube-proxy" --cleanup >"$LOGS/kube-proxy-cleanup.log" 2>&1 || true
	fi
	remove_chains '(KUBE|MWK)-'
	# What an agent with --ambient that did not stop cleanly left (the
	# leak checks reported it): its host rule, then its probe sets.
	if [ -f "$STATE/host-before.ipsets" ]; then
		remove_chains ISTIO_POSTRT "$STATE/host-before.istio-chains"
		local s; for s in $(probe_sets | grep -vxF -f "$STATE/host-before.ipsets" || true); do
			log "removing ipset $s"; ipset destroy "$s" || true
		done
	fi
	# The reference plugins' portmap chains, which it never removes (but
	# for those that were there at up).
	[ "$CNI" != reference ] || remove_chains CNI-HOSTPORT- "$STATE/host-before.chains"
	[ "$NODES" = 1 ] || underlay_down
	release_host
	check_leaks host "$STATE/host-before.json" "" ""
	stop kernel-test-lock
	rm -rf --one-file-system "$STATE"
	log "down in $((SECONDS - t0))s"
	[ "$LEAKS" = 0 ] || { log "error: the leak checks failed (above)"; return 1; }
}

# ------------------------------------------------------------- node faults

# node_command kill|boot|remove NAME: see the header.
node_command() {
	[ "$NODES" -gt 1 ] || die "node: a multi-node cluster only (MESHWIRE_CLUSTER_NODES >= 2)"
	[ -d "$STATE/nodes/${2:-}" ] || die "node: no node '${2:-}' (nodes: $(node_names | tr '\n' ' '))"
	bin_dir
	case $1 in
	kill) node_kill "$2" ;;
	boot)
		node_boot "$2"
		node_start "$2"
		node_flannel "$2"
		;;
	remove)
		kc delete node "$2" --wait=true >&2 || true
		# The other nodes' flanneld removes its route to the node's pod
		# CIDR: not a leak of theirs (network_leaks).
		cat "$STATE/nodes/$2/cidr" "$STATE/nodes/$2/cidr6" >>"$STATE/removed-cidrs" 2>/dev/null || true
		node_stop "$2"
		write_description
		;;
	*) die "node: kill, boot or remove, not '$1'" ;;
	esac
}

# control_command stop|start NAME: stop one of the control plane's
# processes, or start it again with the command it was started with
# (TestAPIServerAway's outage of kube-apiserver).
control_command() {
	local verb=${1:-} name=${2:-}
	case " $CONTROL " in *" $name "*) ;; *) die "control: one of $CONTROL, not '$name'" ;; esac
	[ "$name" != kernel-test-lock ] || die "control: the kernel tests' lock goes with down only"
	[ -f "$RUN/$name.cmd" ] || die "control: $name was never started"
	case $verb in
	stop) stop "$name" ;;
	start)
		if alive "$name"; then die "control: $name is running"; fi
		eval "start $name $(cat "$RUN/$name.cmd")"
		;;
	*) die "control: stop or start, not '$verb'" ;;
	esac
}

status() {
	local c name
	for c in $CONTROL $HOST_NODE; do
		if alive "$c"; then echo "$c: running, pid $(cat "$RUN/$c.pid"), log $LOGS/$c.log"; fi
	done
	for name in $(node_names); do
		for c in holder containerd kubelet kube-proxy flanneld; do
			if alive "$name.$c"; then echo "$name $c: running, pid $(cat "$RUN/$name.$c.pid"), log $LOGS/$name.$c.log"; else echo "$name $c: not running"; fi
		done
	done
	[ -n "${BIN:-}" ] || return 0
	kc get nodes -o wide 2>/dev/null || true
	kc get pods -A -o wide 2>/dev/null || true
}

# main: one function, read whole before it runs, so that editing this file
# while it runs does not change what bash reads next.
main() {
	case ${1:-} in
	up) up ;;
	down) down ;;
	env) bin_dir; env_lines ;;
	status) status ;;
	node) shift; node_command "$@" ;;
	control) shift; control_command "$@" ;;
	istio-cni) shift; istio_mode "$@" ;;
	*) echo "usage: $0 up|down|env|status|node kill|boot|remove NAME|control stop|start NAME|istio-cni sidecar|ambient" >&2; exit 2 ;;
	esac
}

main "$@"; exit
