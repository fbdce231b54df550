# shellcheck shell=bash
# node.sh: the nodes of the multi-node cluster (NODES >= 2). Each node is a
# set of namespaces of its own (nodens.sh: network, mount, cgroup), joined
# to the others and to the host by the underlay, a bridge on the host with
# a veth per node; each runs its own containerd, kubelet, kube-proxy and
# flanneld. The control plane stays on the host, on the underlay's first
# address. Sourced by cluster.sh after common.sh and kube.sh; defines only.
#
# A node's directory, $STATE/nodes/NAME, is its disk: it outlives the
# node's processes and namespaces (a power cut, node_kill), as a node's
# disk outlives a reboot; its /run does not.

UNDERLAY=mwk-ul0                 # the host's bridge
UNDERLAY_PREFIX=198.18.192       # its /24, outside the pod CIDR (198.18.0.0/17)
HOST_UL_IP=$UNDERLAY_PREFIX.1    # the host on it: the API server's address
# The host paths each node has its own copy of (nodens.sh mounts them).
NODE_PRIVATE="/etc/cni/net.d /opt/cni/bin /var/lib/cni /var/lib/kubelet /var/log/pods /var/log/containers /var/log/meshwire"
FLANNEL_BACKEND=${MESHWIRE_CLUSTER_FLANNEL_BACKEND:-vxlan}

# node NAME: the node's variables: N, ND (its directory), NIP, NSOCK, and
# NX, the command prefix that runs a command in it.
node() {
	N=$1 ND=$STATE/nodes/$1
	NIP=$(cat "$ND/ip")
	NSOCK=$ND/containerd.sock
	NX=("$lib/nodens.sh" enter "$ND")
}

node_names() { cat "$STATE/nodes/list" 2>/dev/null || :; }

# ------------------------------------------------------------------ underlay

# underlay_up: the host's bridge, and MWK-UNDERLAY: what a node sends
# beyond the underlay is rejected, never forwarded off the machine.
underlay_up() {
	log "underlay: bridge $UNDERLAY, $HOST_UL_IP/24"
	ip link add "$UNDERLAY" type bridge
	ip addr add "$HOST_UL_IP/24" dev "$UNDERLAY"
	ip link set "$UNDERLAY" up
	iptables -N MWK-UNDERLAY
	iptables -A MWK-UNDERLAY -i "$UNDERLAY" ! -o "$UNDERLAY" \
		-m comment --comment "meshwire cluster: nothing of the nodes leaves the machine" -j REJECT
	iptables -I FORWARD 1 -j MWK-UNDERLAY
	ipfamily_underlay_up
}

underlay_down() {
	if ip link show "$UNDERLAY" >/dev/null 2>&1; then log "removing bridge $UNDERLAY"; ip link del "$UNDERLAY"; fi
}

# ---------------------------------------------------------------- a node

# node_new NAME IP: the node's directory and cgroups (once per node).
node_new() {
	local name=$1 d=$STATE/nodes/$1
	mkdir -p "$d/fs" "$d/config"
	echo "$2" >"$d/ip"
	echo "$name" >>"$STATE/nodes/list"
	printf '%s\n' $NODE_PRIVATE >"$d/private"
	# The node's cgroup in every hierarchy: a child of this process's own
	# (the cluster's processes stay under the session's limits), cpuset's
	# given its parent's CPUs and memory nodes.
	: >"$d/cgroups"
	local ctl path dir
	while IFS=: read -r _ ctl path; do
		case $ctl in "") dir=unified ;; name=*) dir=${ctl#name=} ;; *) dir=$ctl ;; esac
		dir=/sys/fs/cgroup/$dir${path%/}/$name
		mkdir -p "$dir"
		if [ "$ctl" = cpuset ]; then
			cat "$(dirname "$dir")/cpuset.cpus" >"$dir/cpuset.cpus"
			cat "$(dirname "$dir")/cpuset.mems" >"$dir/cpuset.mems"
		fi
		echo "$dir" >>"$d/cgroups"
	done </proc/self/cgroup
	sed 's|$|/cgroup.procs|' "$d/cgroups" >"$d/cgroup-procs"
	node_pki "$name" "$2"
	write_containerd_config "$d/config/containerd.toml" "$d/containerd" /run/containerd "$d/containerd.sock" \
		/run/containerd/runc /opt/cni/bin /etc/cni/net.d
	kubelet_config "$d/config/kubelet.yaml" "$d/containerd.sock" "$2" "$name"
	kube_proxy_config "$d/config/kube-proxy.yaml" "$name" netns
}

# node_boot NAME: what a node has from its power-on: its network namespace,
# its interface on the underlay, its namespaces' holder; then its
# processes (node_start).
node_boot() {
	node "$1"
	rm -f "$ND/ready"
	ip netns add "$N"
	ip link add "$N" type veth peer name eth0 netns "$N"
	ip link set "$N" master "$UNDERLAY" up
	ip -n "$N" addr add "$NIP/24" dev eth0
	ip -n "$N" link set lo up
	ip -n "$N" link set eth0 up
	# The host is the way to the Services (the API server's address is on
	# the underlay itself): no default route, so that nothing a node or
	# its pods send to another address can leave (MWK-UNDERLAY too).
	ip -n "$N" route add "$SERVICE_CIDR" via "$HOST_UL_IP"
	ipfamily_node_boot
	start "$N.holder" "$lib/nodens.sh" hold "$ND" "$N"
	wait_for "node $N's namespaces" 20 test -e "$ND/ready" || die "node $N: nodens.sh hold failed ($LOGS/$N.holder.log)"
	guard "${NX[@]}"
}

# node_start NAME: the node's containerd (with the images), kubelet and
# kube-proxy; flanneld once the node has its pod CIDR.
node_start() {
	node "$1"
	start_containerd "$N" "$ND/config/containerd.toml" "$NSOCK" "${NX[@]}"
	import_image_set "$NSOCK" "$CACHE/images"
	istio_images "$NSOCK"
	fortio_images "$NSOCK"
	[ ! -f "$STATE/images.tar" ] || "$CTR" -a "$NSOCK" -n k8s.io images import --no-unpack "$STATE/images.tar" >/dev/null
	start_kubelet "$N" "$NIP" "$ND/config/kubelet.yaml" /var/lib/kubelet "${NX[@]}"
	start_kube_proxy "$N" "$ND/config/kube-proxy.yaml" "${NX[@]}"
}

# node_flannel NAME: flanneld with the Kubernetes subnet manager (the node's
# pod CIDR from its Node object), and the host's route to that CIDR.
# flannel_converged NAME: the node routes every other node's pod CIDR.
node_flannel() {
	node "$1"
	local cidr
	wait_for "node $N's pod CIDR" 60 node_cidr "$N" || die "node $N got no pod CIDR"
	cidr=$(node_cidr "$N")
	echo "$cidr" >"$ND/cidr"
	ipfamily_node_cidr
	# The control plane runs on no node: the API server reaches the pods
	# (its proxy, the e2e suite's) through the node that holds them.
	ip route replace "$cidr" via "$NIP" dev "$UNDERLAY"
	start "$N.flanneld" "${NX[@]}" env NODE_NAME="$N" "$CACHE/flannel/flanneld" \
		--kube-subnet-mgr --kubeconfig-file "$KCFG/flannel.kubeconfig" \
		--net-config-path "$STATE/config/flannel-net-conf.json" \
		--iface eth0 --ip-masq
	wait_for "flannel's subnet on $N" 60 test -s "$(node_path /run/flannel/subnet.env)" ||
		die "flanneld on $N wrote no subnet file ($LOGS/$N.flanneld.log)"
}

flannel_converged() {
	local other
	for other in $(node_names); do
		[ "$other" = "$1" ] && continue
		"$lib/nodens.sh" enter "$STATE/nodes/$1" ip route show "$(cat "$STATE/nodes/$other/cidr")" | grep -q . || return 1
		[ ! -s "$STATE/nodes/$other/cidr6" ] ||
			"$lib/nodens.sh" enter "$STATE/nodes/$1" ip -6 route show "$(cat "$STATE/nodes/$other/cidr6")" | grep -q . || return 1
	done
}

node_cidr() { kc get node "$1" -o jsonpath='{.spec.podCIDR}' 2>/dev/null | grep .; }

# node_path PATH: where the host sees the current node's PATH: its disk
# for the node's own directories, its holder's root otherwise.
node_path() {
	local p
	for p in $NODE_PRIVATE; do
		case $1 in "$p" | "$p"/*) echo "$ND/fs$1"; return ;; esac
	done
	echo "/proc/$(cat "$ND/holder.pid")/root$1"
}

# node_kill NAME: a power cut: every process of the node (containerd,
# kubelet, kube-proxy, flanneld, the pods) killed at once through its
# cgroup, then its namespaces go (its interfaces, routes, firewall, /run);
# its disk stays.
node_kill() {
	node "$1"
	local unified
	unified=$(grep -m1 '/unified/' "$ND/cgroups")
	if [ -e "$unified/cgroup.kill" ]; then
		log "node $N: power cut (cgroup.kill of $unified)"
		echo 1 >"$unified/cgroup.kill"
		wait_for "node $N's processes gone" 30 grep -qx 'populated 0' "$unified/cgroup.events" ||
			die "node $N: processes left in $unified"
	fi
	local c; for c in holder containerd kubelet kube-proxy flanneld; do rm -f "$RUN/$N.$c.pid"; done
	ip route del "$(cat "$ND/cidr" 2>/dev/null || echo none)" 2>/dev/null || true
	ip netns del "$N" 2>/dev/null || true
}

# node_remove NAME: the node gone for good: its processes, namespaces,
# cgroups (runc's children first), disk and Node object.
node_remove() {
	node_kill "$1"
	local d
	while read -r d; do
		find "$d" -mindepth 1 -depth -type d -exec rmdir {} \; 2>/dev/null || true
		rmdir "$d" || log "node $N: could not remove cgroup $d"
	done <"$ND/cgroups"
	rm -rf --one-file-system "$ND"
	sed -i "/^$N\$/d" "$STATE/nodes/list"
}

# node_stop NAME: the node's processes stopped in order (kube-proxy,
# flanneld, kubelet, containerd), then node_remove.
node_stop() {
	node "$1"
	local c
	for c in kube-proxy flanneld kubelet containerd; do stop "$N.$c"; done
	node_remove "$N"
}

# ------------------------------------------------------------ pod network

# flannel_setup: flanneld's configuration and its RBAC (a client
# certificate bound to the role flannel's own manifest grants).
flannel_setup() {
	flannel_net_conf >"$STATE/config/flannel-net-conf.json" # (lib/ipfamily.sh)
	cert flannel flannel "" clientAuth
	kubeconfig flannel flannel
	kc apply -f - >&2 <<EOF
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: flannel}
rules:
  - apiGroups: [""]
    resources: [pods]
    verbs: [get]
  - apiGroups: [""]
    resources: [nodes]
    verbs: [get, list, watch]
  - apiGroups: [""]
    resources: [nodes/status]
    verbs: [patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: flannel}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: flannel}
subjects:
  - {apiGroup: rbac.authorization.k8s.io, kind: User, name: flannel}
EOF
}

# flannel_conflist: the node's CNI config as flannel's manifest installs it
# (kube-flannel.yml's cni-conf.json: flannel delegating to bridge and
# host-local, portmap), with bandwidth as k3s adds it.
flannel_conflist() {
	cat <<EOF
{
  "name": "cbr0",
  "cniVersion": "0.3.1",
  "plugins": [
    {"type": "flannel", "delegate": {"hairpinMode": true, "isDefaultGateway": true}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "bandwidth", "capabilities": {"bandwidth": true}}
  ]
}
EOF
}

# node_cni NAME: the node's CNI binaries (the base plugins of the network
# kind: meshwire's, installed with make install as a distribution would
# ship them, also under istio-cni, or the reference v1.9.1's; flannel's
# plugin v0.9.1) and flannel's conflist.
node_cni() {
	node "$1"
	local bin=$ND/fs/opt/cni/bin p
	if [ "$CNI" != reference ]; then
		make -s -C "$repo" install CNI_BIN_DIR="$bin" BINDIR="$ND/fs/usr/local/bin" >/dev/null
	else
		for p in bridge host-local portmap bandwidth loopback; do install -m 0755 "$CACHE/reference/$p" "$bin/$p"; done
	fi
	install -m 0755 "$CACHE/flannel/cni/flannel" "$bin/flannel"
	flannel_conflist >"$ND/fs/etc/cni/net.d/10-flannel.conflist"
}
