#!/bin/bash
# nodens.sh: the namespaces of one node of the multi-node cluster
# (node.sh), in the manner of a kind node without its container image:
# the node's own network namespace (its interfaces, routes, firewall,
# conntrack), a mount namespace of its own (its sysfs, bpffs, cgroup
# mounts and /run, and the node's own copies of the directories a node
# keeps: CNI binaries and configs, CNI and kubelet state, pod logs,
# meshwire's log), and a cgroup subtree and namespace of its own (what its
# processes see as the cgroup root is the node's subtree, where meshwire's
# fast path attaches).
#
#   nodens.sh hold DIR NETNS   the node's holder process: joins the node's
#                              cgroups (DIR/cgroup-procs), enters NETNS,
#                              unshares the mount, cgroup and UTS
#                              namespaces, names the node NETNS (its
#                              hostname, as a kind node's), mounts,
#                              writes DIR/ready and sleeps; its
#                              namespaces are the node's for as long as it
#                              lives (cluster.sh starts it with setsid)
#   nodens.sh enter DIR CMD... CMD in the node: its cgroups, then the
#                              holder's network, mount, cgroup and UTS
#                              namespaces
#
# DIR/private lists the host paths the node has its own copy of (DIR/fs
# plus the path); node.sh writes it and creates the mount points.
set -euo pipefail

# join DIR: the calling process into the node's cgroup in every hierarchy
# (a process keeps its cgroups when it enters a cgroup namespace).
join() {
	local f
	for f in $(cat "$1/cgroup-procs"); do echo $$ >"$f"; done
}

case ${1:-} in
enter)
	dir=$2; shift 2
	join "$dir"
	exec nsenter --target "$(cat "$dir/holder.pid")" --net --mount --cgroup --uts -- "$@"
	;;
hold)
	dir=$2 netns=$3
	join "$dir"
	echo $$ >"$dir/holder.pid"
	exec nsenter --net="/run/netns/$netns" unshare --mount --cgroup --uts --propagation private "$0" mounts "$dir" "$netns"
	;;
mounts)
	# In the node's namespaces, as the holder (its pid is the one hold
	# wrote: nsenter and unshare exec without forking).
	dir=$2
	# The node's own hostname: what a host-network pod's hostname is
	# (Kubernetes' e2e specs of internalTrafficPolicy=Local compare it
	# with the node's name).
	hostname "$3"
	# sysfs shows the network devices of the namespace that mounts it:
	# the node's, not the host's (kubelet, flannel and the plugins read
	# /sys/class/net).
	umount -l /sys
	mount -t sysfs sysfs /sys
	# The cgroup hierarchies as mounted from inside the node's cgroup
	# namespace: their root is the node's subtree.
	mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup
	while IFS=: read -r _ ctl _; do
		case $ctl in
		"") mkdir -p /sys/fs/cgroup/unified && mount -t cgroup2 cgroup2 /sys/fs/cgroup/unified ;;
		name=*) mkdir -p "/sys/fs/cgroup/${ctl#name=}" && mount -t cgroup -o "none,$ctl" cgroup "/sys/fs/cgroup/${ctl#name=}" ;;
		*) mkdir -p "/sys/fs/cgroup/$ctl" && mount -t cgroup -o "$ctl" cgroup "/sys/fs/cgroup/$ctl" ;;
		esac
	done </proc/self/cgroup
	# A bpffs of its own: the node's pins (meshwire's fast path).
	mount -t bpf bpf /sys/fs/bpf
	# The host's mounts under /run go first: the network namespaces
	# other nodes' holders keep there would otherwise live as long as
	# this node does.
	awk '$5 ~ "^/run/" {print $5}' /proc/self/mountinfo | sort -r | while read -r m; do umount -l "$m" 2>/dev/null || true; done
	# /run is volatile, as on a node that boots: containerd's state,
	# runc's, the pods' namespaces, flannel's subnet file, ztunnel's
	# socket, the firewall tools' locks.
	mount -t tmpfs -o mode=755 run /run
	mkdir -p /run/netns
	while read -r p; do
		# (The mount point is made on the host's file system: down
		# removes the ones up did not find, lib/host.sh's NEW_DIRS.)
		mkdir -p "$dir/fs$p" "$p"
		mount --bind "$dir/fs$p" "$p"
	done <"$dir/private"
	# Every mount shared, as systemd makes them (the runtime's propagated
	# volumes need it), in peer groups of the node's own.
	mount --make-rshared /
	touch "$dir/ready"
	exec sleep infinity
	;;
*)
	echo "usage: $0 hold DIR NETNS | enter DIR CMD..." >&2
	exit 2
	;;
esac
