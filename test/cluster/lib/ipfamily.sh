# shellcheck shell=bash
# ipfamily.sh: the cluster's address families, MESHWIRE_CLUSTER_IP_FAMILY
# (make cluster IP_FAMILY=...): ipv4, the default, or dual: IPv4 and IPv6,
# IPv4 primary, as a dual-stack kind cluster is. Dual stack gives
#   - the pods an IPv6 CIDR beside the IPv4 one (the controller manager
#     allocates each node one of each; host-local gets two range sets in
#     the node's conflist: meshwire's --pod-cidr twice, the control's
#     conflist the same, flannel's from its subnet file),
#   - the Services an IPv6 range beside the IPv4 one (the API server's and
#     the controller manager's --service-cluster-ip-range v4,v6),
#   - every node an IPv6 address (kubelet's --node-ip v4,v6): on one node
#     the host's own (that of the default IPv6 route's interface, which
#     nothing routes to: the apiserver and the suites use the IPv4 one);
#     on several, one on the node's underlay veth (no DAD), the underlay
#     bridge one too, and flannel EnableIPv6 with the IPv6 pod CIDR,
#   - kube-proxy both CIDRs (clusterCIDR v4,v6), the guard (MWK-GUARD) and
#     the underlay's MWK-UNDERLAY in ip6tables too.
# Every IPv6 range is a ULA prefix of the cluster's own (fd6d:776b::/32),
# never the machine's uplink fd00::/64. With ipv4, every function here
# leaves the cluster as it was before dual stack existed.
# Sourced by cluster.sh after common.sh, kube.sh and node.sh; defines only.

POD_CIDR6_ONE=fd6d:776b:1::/64   # one node: the node's whole range
POD_CIDR6_MANY=fd6d:776b:1::/56  # several: a /64 per node
NODE_CIDR_MASK6=64
SERVICE_CIDR6_DUAL=fd6d:776b:2::/112
UNDERLAY6_PREFIX=fd6d:776b:ff    # the underlay's /64 (node.sh's UNDERLAY)
HOST_UL_IP6=$UNDERLAY6_PREFIX::1 # the host on it

# ipfamily_addresses: after cluster.sh set POD_CIDR, NODE_CIDR_MASK and
# SERVICE_CIDR: POD_CIDRS and SERVICE_CIDRS (the flags' comma lists),
# NODE_CIDR_MASK_FLAGS (the controller manager's), and in dual stack
# POD_CIDR6, SERVICE_CIDR6 and, on one node, NODE_IP6.
ipfamily_addresses() {
	POD_CIDRS=$POD_CIDR SERVICE_CIDRS=$SERVICE_CIDR
	NODE_CIDR_MASK_FLAGS=(--node-cidr-mask-size "$NODE_CIDR_MASK")
	POD_CIDR6="" SERVICE_CIDR6=""
	[ "$IP_FAMILY" = dual ] || return 0
	SERVICE_CIDR6=$SERVICE_CIDR6_DUAL
	if [ "$NODES" = 1 ]; then
		POD_CIDR6=$POD_CIDR6_ONE
		# The node's IPv6 address: the global one of the default IPv6
		# route's interface, named and advertised, never routed to.
		NODE_IP6=${NODE_IP6:-$(ip -6 -o addr show scope global dev "$(ip -6 route show default | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i+1); exit}}')" 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')}
	else
		POD_CIDR6=$POD_CIDR6_MANY
	fi
	POD_CIDRS=$POD_CIDR,$POD_CIDR6 SERVICE_CIDRS=$SERVICE_CIDR,$SERVICE_CIDR6
	NODE_CIDR_MASK_FLAGS=(--node-cidr-mask-size-ipv4 "$NODE_CIDR_MASK" --node-cidr-mask-size-ipv6 "$NODE_CIDR_MASK6")
}

# ipfamily_check: up refuses a dual-stack cluster it cannot give an IPv6
# node address.
ipfamily_check() {
	[ "$IP_FAMILY" = dual ] && [ "$NODES" = 1 ] || return 0
	[ -n "${NODE_IP6:-}" ] || die "MESHWIRE_CLUSTER_IP_FAMILY=dual on one node: the host has no global IPv6 address on its default IPv6 route's interface (set NODE_IP6)"
}

# ip6_of IP: the node's IPv6 address beside its IPv4 address IP: the
# host's on one node; on the underlay, the same last number in its /64
# (198.18.192.11 is fd6d:776b:ff::11).
ip6_of() {
	if [ "$NODES" = 1 ]; then echo "$NODE_IP6"; else echo "$UNDERLAY6_PREFIX::${1##*.}"; fi
}

# node_ips IP: kubelet's --node-ip: IP, and in dual stack its IPv6
# address after it (IPv4 stays the primary family).
node_ips() {
	if [ "$IP_FAMILY" = dual ]; then echo "$1,$(ip6_of "$1")"; else echo "$1"; fi
}

# ipfamily_san IP: the IPv6 address of a kubelet's serving certificate,
# as a subjectAltName continuation (",IP:..."), or nothing.
ipfamily_san() {
	if [ "$IP_FAMILY" = dual ]; then echo ",IP:$(ip6_of "$1")"; fi
}

# ipfamily_guard [PREFIX...]: MWK-GUARD (cluster.sh guard) for the IPv6
# Service range.
ipfamily_guard() {
	[ -n "$SERVICE_CIDR6" ] || return 0
	"$@" ip6tables -N MWK-GUARD
	"$@" ip6tables -A MWK-GUARD -d "$SERVICE_CIDR6" -m conntrack ! --ctstate DNAT \
		-m comment --comment "meshwire cluster: no Service at this address" -j REJECT
	"$@" ip6tables -I FORWARD 1 -j MWK-GUARD
	"$@" ip6tables -I OUTPUT 1 -j MWK-GUARD
}

# ipfamily_conflist: the one node's conflist (stdin) with host-local's
# second range set, the IPv6 pod CIDR, and IPv6's default route.
ipfamily_conflist() {
	if [ "$IP_FAMILY" != dual ]; then cat; return; fi
	local out
	out=$(sed -e "s|\"ranges\": \[\[\({\"subnet\": \"[^\"]*\"}\)\]\]|\"ranges\": [[\1], [{\"subnet\": \"$POD_CIDR6\"}]]|" \
		-e 's|"routes": \[{"dst": "0.0.0.0/0"}\]|"routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]|')
	grep -q "\"subnet\": \"$POD_CIDR6\"" <<<"$out" && grep -q '"dst": "::/0"' <<<"$out" ||
		die "ipfamily_conflist: no host-local ranges and routes of the expected form to add IPv6 to"
	echo "$out"
}

# ipfamily_kustomization FILE: meshwire's kustomization (one node) with
# the IPv6 pod CIDR as a second --pod-cidr after the first.
ipfamily_kustomization() {
	[ "$IP_FAMILY" = dual ] || return 0
	sed -i "s|^\( *\)- --pod-cidr=.*|&\n\1- --pod-cidr=$POD_CIDR6|" "$1"
	grep -q -- "- --pod-cidr=$POD_CIDR6\$" "$1" || die "ipfamily_kustomization: no --pod-cidr in $1"
}

# ipfamily_underlay_up: the host's IPv6 address on the underlay bridge,
# and MWK-UNDERLAY in ip6tables (node.sh underlay_up).
ipfamily_underlay_up() {
	[ "$IP_FAMILY" = dual ] || return 0
	ip addr add "$HOST_UL_IP6/64" dev "$UNDERLAY" nodad
	ip6tables -N MWK-UNDERLAY
	ip6tables -A MWK-UNDERLAY -i "$UNDERLAY" ! -o "$UNDERLAY" \
		-m comment --comment "meshwire cluster: nothing of the nodes leaves the machine" -j REJECT
	ip6tables -I FORWARD 1 -j MWK-UNDERLAY
}

# ipfamily_node_boot: the node's (node.sh's N, NIP) IPv6 address on its
# underlay veth, without DAD (it is unique by construction, and would
# otherwise stay tentative for a second or two after every boot), and
# its route to the IPv6 Service range through the host; and IPv6
# forwarding on, as a dual-stack node has it (kubeadm's preflight asks
# for it) before its network is installed. Otherwise the bridge plugin's
# first ADD turns it on, the kernel adds each interface's subnet-router
# anycast routes (local table, fe80::/128 and the underlay's prefix), and
# down's leak check finds them (seen with meshwire and the reference
# alike, two nodes, 2026-11-29).
ipfamily_node_boot() {
	[ "$IP_FAMILY" = dual ] || return 0
	ip netns exec "$N" sysctl -qw net.ipv6.conf.all.forwarding=1
	ip -n "$N" addr add "$(ip6_of "$NIP")/64" dev eth0 nodad
	ip -n "$N" route add "$SERVICE_CIDR6" via "$HOST_UL_IP6"
}

# flannel_net_conf: flanneld's net-conf.json (node.sh flannel_setup).
flannel_net_conf() {
	if [ "$IP_FAMILY" = dual ]; then
		printf '{"Network": "%s", "EnableIPv6": true, "IPv6Network": "%s", "Backend": {"Type": "%s"}}\n' \
			"$POD_CIDR" "$POD_CIDR6" "$FLANNEL_BACKEND"
	else
		printf '{"Network": "%s", "Backend": {"Type": "%s"}}\n' "$POD_CIDR" "$FLANNEL_BACKEND"
	fi
}

# node_cidr6 NAME: the node's IPv6 pod CIDR (dual stack).
node_cidr6() { kc get node "$1" -o jsonpath='{.spec.podCIDRs[1]}' 2>/dev/null | grep .; }

# ipfamily_node_cidr: in dual stack, the node's (node.sh's N, ND) IPv6 pod
# CIDR into ND/cidr6, which flannel_converged waits for on the others.
ipfamily_node_cidr() {
	[ "$IP_FAMILY" = dual ] || return 0
	wait_for "node $N's IPv6 pod CIDR" 60 node_cidr6 "$N" || die "node $N got no IPv6 pod CIDR"
	node_cidr6 "$N" >"$ND/cidr6"
}
