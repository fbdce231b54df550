# shellcheck shell=bash
# host.sh: what a cluster run changes on the host and puts back: the
# snapshot of the host before up (sysctls, paths, mounts, chains), the
# firewall chains of the run, and release_host, which removes what the
# runtime's pods and the plugins may have left once containerd stopped.
# Sourced after common.sh (cluster.sh, critest.sh); defines only. The
# caller sets BRIDGE, NETWORK, POD_CIDR, SOCK, CNI_BIN of the node that runs
# on the host (the single node, critest's containerd).

# What the cluster may change on the host, recorded at up and put back at
# down: sysctls kubelet, kube-proxy and the bridge plugin set, and whether
# the host paths the components write to existed.
SYSCTLS="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes
net.ipv4.ip_forward net.ipv6.conf.all.forwarding net.ipv4.conf.all.route_localnet net.netfilter.nf_conntrack_max
net.netfilter.nf_conntrack_tcp_timeout_established net.netfilter.nf_conntrack_tcp_timeout_close_wait net.bridge.bridge-nf-call-iptables"
# Host paths kubelet, containerd and the CNI plugins create outside the state
# directory, and the mount points of the nodes' own directories (node.sh):
# removed at down when they did not exist at up (the shared ones only when
# empty: other users of this machine may have put things there meanwhile).
NEW_TREES="/var/log/pods /var/log/containers /var/lib/kubelet /run/istio-cni" # kubelet: container logs, device-plugins socket; istio-cni's sockets (lib/istio.sh)
NEW_DIRS="/run/containerd/s /run/containerd /var/lib/cni/results /var/lib/cni/networks /var/lib/cni/meshwire/fastpath /var/lib/cni/meshwire/intercept /var/lib/cni/meshwire/pods /var/lib/cni/meshwire/ambient/enrolled /var/lib/cni/meshwire/ambient /var/lib/cni/meshwire /var/lib/cni /run/ztunnel
/etc/cni/net.d /etc/cni /opt/cni/bin /opt/cni /var/log/meshwire"

# The pods' cgroup parents (containerd's namespace; critest asks for
# test.slice), in every hierarchy.
CGROUP_PARENTS=k8s.io
IPTABLES_CMDS="iptables ip6tables iptables-legacy ip6tables-legacy"

snapshot_host() {
	local f=$STATE/host-before
	: >"$f.sysctl"
	for s in $SYSCTLS; do
		v=$(sysctl -n "$s" 2>/dev/null) && printf '%s=%s\n' "$s" "$v" >>"$f.sysctl"
	done
	: >"$f.paths"
	for p in $NEW_TREES $NEW_DIRS; do [ -e "$p" ] && echo "$p" >>"$f.paths"; done
	ip link show "$BRIDGE" >/dev/null 2>&1 && echo "$BRIDGE" >"$f.bridge" || : >"$f.bridge"
	cgroup_parents >"$f.cgroups"
	chains CNI-HOSTPORT- >"$f.chains" # the reference control's portmap
	# ambient mode's host rule and probe sets (cluster.sh ambient)
	chains ISTIO_POSTRT >"$f.istio-chains"
	probe_sets >"$f.ipsets"
	ls /run/netns 2>/dev/null >"$f.netns" || :
	# meshwire's DaemonSet mounts the host's bpffs with Bidirectional
	# propagation (the agent mounts one there on a host without), which
	# the runtime allows only on a shared mount. systemd makes every mount
	# shared; on this machine, without systemd, up does.
	: >"$f.bpffs"
	if [ "$(findmnt -n -o PROPAGATION /sys/fs/bpf 2>/dev/null)" = private ]; then
		log "making /sys/fs/bpf a shared mount (as systemd does), private again at down"
		mount --make-shared /sys/fs/bpf
		echo private >"$f.bpffs"
	fi
	# The same for its HostToContainer mount of /run/netns, where the
	# runtime keeps the pods' namespaces: a shared bind mount of its own,
	# as `ip netns add` makes it.
	mkdir -p /run/netns
	: >"$f.netns-mount"
	case $(findmnt -n -o PROPAGATION -M /run/netns 2>/dev/null) in
	shared* | *slave*) ;;
	*)
		log "making /run/netns a shared mount (as ip netns add does); removed at down when empty"
		mount --bind /run/netns /run/netns && mount --make-shared /run/netns
		echo made >"$f.netns-mount"
		;;
	esac
}

# probe_sets: the ipsets of ambient mode's host rule on the host. The
# host snapshot (test/harness) has no ipsets: down checks these itself.
probe_sets() { ipset list -n 2>/dev/null | grep -E '^istio-inpod-probes-' || true; }

# check_probe_sets: after the drain, ambient mode's probe sets are gone
# (the agent removes them, and its host rule, when it stops with no pod
# enrolled: the drain deletes the pods before meshwire's DaemonSet).
check_probe_sets() {
	local left
	left=$(probe_sets | grep -vxF -f "$STATE/host-before.ipsets" || true)
	if [ -n "$left" ]; then
		log "leak check (ambient) FAILED: probe sets left: $(echo $left)"
		LEAKS=1
	else
		log "leak check (ambient): no probe set left"
	fi
}

# cgroup_parents: the pods' cgroup parents in each hierarchy; kubelet's
# kubepods too with POD_CGROUPS=1.
cgroup_parents() {
	local p
	for p in $CGROUP_PARENTS $([ "${POD_CGROUPS:-0}" = 0 ] || echo kubepods); do ls -d /sys/fs/cgroup/*/"$p" 2>/dev/null || :; done
}

# The shims of this cluster's containerd (they outlive it by design).
our_shims() {
	local p
	for p in /proc/[0-9]*; do
		tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -q "containerd-shim.*-address $SOCK " && basename "$p"
	done
	return 0
}

# Mounts under the state directory, deepest first.
our_mounts() {
	awk -v s="$STATE" '$5 == s || index($5, s "/") == 1 {print $5}' /proc/self/mountinfo | sort -r
}

# sweep_cni NETNS-BEFORE: what the plugins' DEL would have removed for
# sandboxes never torn down (a killed kubelet or containerd, an interrupted
# run). The CNI GC of the cluster's network (CNI 1.1) with no valid
# attachment: each plugin removes what it keeps on the host for the network
# (masquerade tables, port mappings, shaping devices). Then the network
# namespaces containerd made (cni-*) since up whose eth0 is in the pod CIDR.
sweep_cni() {
	local netns_before=$1
	[ -x "$CNI_BIN/bridge" ] || return 0
	local tmp t n addr
	tmp=$(mktemp -d /tmp/mwk-gc.XXXXXX)
	for t in bridge portmap bandwidth; do
		local extra=""
		[ "$t" = bridge ] && extra=',"bridge":"'$BRIDGE'","isGateway":true,"ipMasq":true,"ipam":{"type":"host-local","dataDir":"'$tmp'","ranges":[[{"subnet":"'$POD_CIDR'"}]]}'
		printf '{"cniVersion":"1.1.0","name":"%s","type":"%s"%s,"cni.dev/valid-attachments":[]}' "$NETWORK" "$t" "$extra" |
			CNI_COMMAND=GC CNI_PATH=$CNI_BIN "$CNI_BIN/$t" >/dev/null 2>&1 || log "CNI GC of $NETWORK by $t failed"
	done
	rm -rf "$tmp"
	local prefix=${POD_CIDR%/*} # 198.18.0.0/16: 198.18
	prefix=${prefix%.0}; prefix=${prefix%.0}
	for n in /run/netns/cni-*; do
		[ -e "$n" ] || continue
		grep -qx "${n##*/}" "$netns_before" 2>/dev/null && continue
		addr=$(nsenter --net="$n" ip -4 -o addr show dev eth0 2>/dev/null | awk '{print $4; exit}')
		case $addr in "$prefix".*)
			log "removing network namespace ${n##*/} ($addr) of a sandbox never torn down"
			ip netns del "${n##*/}" || true ;;
		esac
	done
}

# chains REGEX: "CMD TABLE CHAIN" of every chain whose name matches
# ^REGEX, in every table of every iptables variant.
chains() {
	local cmd t
	for cmd in $IPTABLES_CMDS; do
		command -v "$cmd" >/dev/null || continue
		for t in filter nat mangle raw; do
			"$cmd" -t "$t" -S 2>/dev/null | awk -v c="$cmd" -v t="$t" -v re="^$1" '$1 == "-N" && $2 ~ re {print c, t, $2}'
		done
	done
}

# remove_chains REGEX [BEFORE]: the chains matching ^REGEX and the rules
# that jump to them, but for those BEFORE lists (chains' output: what was
# there at up). With make test's seed on the host (it appeared meanwhile),
# its rules and the chains they use are left alone.
remove_chains() {
	local re=$1 before=${2:-/dev/null}
	if seeded; then
		log "make test's host seed is on this host: removing only the $re rules and chains it does not use"
	fi
	local cmd t chain old keep
	for cmd in $IPTABLES_CMDS; do
		command -v "$cmd" >/dev/null || continue
		for t in filter nat mangle raw; do
			"$cmd" -t "$t" -S >/dev/null 2>&1 || continue
			old=$(awk -v c="$cmd" -v t="$t" '$1 == c && $2 == t {print $3}' "$before" | tr '\n' ' ')
			keep="$old $("$cmd" -t "$t" -S 2>/dev/null | awk '/meshwire-seed/ {for (i = 1; i < NF; i++) if ($i == "-j") print $(i+1)}' | tr '\n' ' ')"
			# The rules that jump to such a chain (not one of BEFORE's)
			# from the others and from BEFORE's...
			"$cmd" -t "$t" -S 2>/dev/null | awk -v re="^$re" -v old=" $old " '$1 == "-A" && ($2 !~ re || index(old, " " $2 " ")) && !/meshwire-seed/ {
				for (i = 1; i < NF; i++) if ($i == "-j" && $(i+1) ~ re && index(old, " " $(i+1) " ") == 0) print }' |
				while read -r _ rule; do eval "\"$cmd\" -t $t -D $rule" 2>/dev/null || true; done
			# ... then the chains themselves.
			for chain in $(chains "$re" | awk -v c="$cmd" -v t="$t" '$1 == c && $2 == t {print $3}'); do
				case " $keep " in *" $chain "*) continue ;; esac
				"$cmd" -t "$t" -F "$chain" 2>/dev/null || true
			done
			for chain in $(chains "$re" | awk -v c="$cmd" -v t="$t" '$1 == c && $2 == t {print $3}'); do
				case " $keep " in *" $chain "*) continue ;; esac
				"$cmd" -t "$t" -X "$chain" 2>/dev/null || true
			done
		done
	done
}

# release_host: after containerd stopped, what its pods and the plugins may
# have left (shims, containers, mounts, network namespaces, the bridge,
# sysctls, cgroups, CNI state, host paths).
release_host() {
	local pids
	pids=$(our_shims)
	if [ -n "$pids" ]; then
		log "stopping containerd shims: $pids"
		kill -KILL $pids 2>/dev/null || true
		sleep 1
	fi
	# Containers still running (containerd or kubelet killed before the
	# drain could stop them): runc kills their processes and removes their
	# cgroups and state.
	local root id
	for root in "$STATE"/containerd/runc/*/; do
		[ -d "$root" ] || continue
		for id in $("$RUNC" --root "$root" list -q 2>/dev/null); do
			log "removing container ${id:0:12}, left running"
			"$RUNC" --root "$root" delete --force "$id" >/dev/null 2>&1 || log "runc delete --force $id failed"
		done
	done
	local m
	for m in $(our_mounts); do umount "$m" 2>/dev/null || umount -l "$m" || true; done
	[ -z "$(our_mounts)" ] || die "mounts left under $STATE: $(our_mounts | tr '\n' ' '); not removing it"

	# Host paths the cluster created.
	local before=$STATE/host-before
	sweep_cni "$before.netns"
	if [ -s "$before.bridge" ] || ! ip link show "$BRIDGE" >/dev/null 2>&1; then :; else
		log "removing bridge $BRIDGE"; ip link del "$BRIDGE" || true
	fi
	if [ "$(cat "$before.bpffs" 2>/dev/null)" = private ]; then mount --make-private /sys/fs/bpf || true; fi
	if [ "$(cat "$before.netns-mount" 2>/dev/null)" = made ] && [ -z "$(ls -A /run/netns)" ]; then umount /run/netns || true; fi
	if [ -f "$before.sysctl" ]; then
		while IFS='=' read -r k v; do
			[ "$(sysctl -n "$k" 2>/dev/null)" = "$v" ] || sysctl -q -w "$k=$v" >/dev/null 2>&1 || log "could not restore $k=$v"
		done <"$before.sysctl"
	fi
	# The pods' cgroup parent runc made in each hierarchy (containerd's
	# namespace; kubelet's kubepods tree with POD_CGROUPS=1), when empty.
	for p in $(cgroup_parents); do
		grep -qx "$p" "$before.cgroups" 2>/dev/null || find "$p" -depth -type d -exec rmdir {} + 2>/dev/null || true
	done
	# The CNI state of the cluster's network (its own name: always its).
	rm -rf "/var/lib/cni/networks/$NETWORK"
	rm -f /var/lib/cni/results/"$NETWORK"-*
	local p
	if [ -f "$before.paths" ]; then
		for p in $NEW_TREES; do
			grep -qx "$p" "$before.paths" || rm -rf --one-file-system "$p"
		done
		for p in $NEW_DIRS; do
			grep -qx "$p" "$before.paths" || rmdir "$p" 2>/dev/null || true
		done
	fi
	if [ -f "$before.netns" ]; then
		for p in $(ls /run/netns 2>/dev/null); do
			grep -qx "$p" "$before.netns" || log "note: network namespace $p appeared while the cluster ran (not necessarily its own; left alone)"
		done
	fi
}
