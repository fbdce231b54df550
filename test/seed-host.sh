#!/bin/sh
# Seeds this host with the state a lived-in node carries before meshwire's
# tests run, and removes it again: `seed-host.sh add` before the suite,
# `seed-host.sh remove` after (make test does both). The tests must pass
# with it in place: foreign state is neither a leak nor damage.
#
# What it adds, in the root network namespace (tests use their own):
# - Docker-style: the DOCKER* chains of nat and filter with the jumps Docker
#   installs and its 172.17.0.0/16 masquerade (FORWARD's policy stays ACCEPT:
#   Docker's DROP blocks every bridge plugin's pods, the reference's too,
#   unless a firewall plugin is chained, which is not what this seeds);
# - kube-proxy-style: KUBE-SERVICES/KUBE-POSTROUTING/KUBE-FORWARD chains with
#   a service rule, and kube-proxy's nftables table `ip kube-proxy`;
# - the reference portmap's shared, empty CNI-HOSTPORT-* chains with their
#   jumps, as it leaves them after its last pod (IPv4 and IPv6);
# - the legacy filter and nat tables loaded (iptables-legacy), with a rule.
# Everything carries the comment or name "meshwire-seed" or is a chain only
# the seed creates, so `remove` takes away exactly what `add` made.
set -eu

# The seed's restore scripts, one per tool; `remove` takes their chains
# (table:chain) and deletes every rule commented meshwire-seed.

# The reference portmap's shared chains and jumps, the same in both
# families: the nat lines of v4_nft and v6_nft.
hostport_nat() {
	cat <<'R'
:CNI-HOSTPORT-DNAT - [0:0]
:CNI-HOSTPORT-SETMARK - [0:0]
:CNI-HOSTPORT-MASQ - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT -m comment --comment meshwire-seed
-A OUTPUT -m addrtype --dst-type LOCAL -j CNI-HOSTPORT-DNAT -m comment --comment meshwire-seed
-A POSTROUTING -j CNI-HOSTPORT-MASQ -m comment --comment meshwire-seed
-A CNI-HOSTPORT-MASQ -m mark --mark 0x2000/0x2000 -j MASQUERADE
-A CNI-HOSTPORT-SETMARK -j MARK --set-xmark 0x2000/0x2000
R
}

v4_nft() {
	cat <<'R'
*filter
:DOCKER - [0:0]
:DOCKER-USER - [0:0]
:DOCKER-ISOLATION-STAGE-1 - [0:0]
:KUBE-FORWARD - [0:0]
-A FORWARD -j DOCKER-USER -m comment --comment meshwire-seed
-A FORWARD -j DOCKER-ISOLATION-STAGE-1 -m comment --comment meshwire-seed
-A FORWARD -o docker0 -j DOCKER -m comment --comment meshwire-seed
-A FORWARD -j KUBE-FORWARD -m comment --comment meshwire-seed
-A DOCKER-USER -j RETURN
-A DOCKER-ISOLATION-STAGE-1 -j RETURN
-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP
COMMIT
*nat
:DOCKER - [0:0]
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-SVC-MESHWIRESEED - [0:0]
-A PREROUTING -m addrtype --dst-type LOCAL -j DOCKER -m comment --comment meshwire-seed
-A OUTPUT ! -d 127.0.0.0/8 -m addrtype --dst-type LOCAL -j DOCKER -m comment --comment meshwire-seed
-A POSTROUTING -s 172.17.0.0/16 ! -o docker0 -j MASQUERADE -m comment --comment meshwire-seed
-A PREROUTING -j KUBE-SERVICES -m comment --comment meshwire-seed
-A OUTPUT -j KUBE-SERVICES -m comment --comment meshwire-seed
-A POSTROUTING -j KUBE-POSTROUTING -m comment --comment meshwire-seed
-A KUBE-SERVICES -d 10.96.0.10/32 -p udp --dport 53 -j KUBE-SVC-MESHWIRESEED
-A KUBE-SVC-MESHWIRESEED -p udp -j DNAT --to-destination 192.0.2.53:53
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
R
	hostport_nat
	echo COMMIT
}

v6_nft() {
	echo '*nat'
	hostport_nat
	echo COMMIT
}

v4_legacy() {
	cat <<'R'
*filter
:MESHWIRE-SEED - [0:0]
-A INPUT -j MESHWIRE-SEED -m comment --comment meshwire-seed
-A MESHWIRE-SEED -p tcp --dport 9 -j DROP
COMMIT
*nat
:MESHWIRE-SEED - [0:0]
-A PREROUTING -j MESHWIRE-SEED -m comment --comment meshwire-seed
COMMIT
R
}

kube_nft() {
	cat <<'R'
table ip kube-proxy {
	comment "meshwire-seed"
	chain services {
		ip daddr 10.96.0.1 tcp dport 443 dnat to 192.0.2.1:6443
	}
	chain nat-prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		jump services
	}
	chain nat-output {
		type nat hook output priority -100; policy accept;
		jump services
	}
}
R
}

# undo reads a tool's save output and writes the restore script that
# removes the seed from it: with "rules", every rule commented
# meshwire-seed deleted (however many copies) and the seed's chains flushed;
# with "chains", those chains deleted (a second transaction: iptables-nft
# refuses to delete a chain in the one that deletes the last jump to it).
# $2 lists the seed's chains as table:chain.
undo() {
	awk -v what="$1" -v seeded="$2" '
	BEGIN { n = split(seeded, s, " "); for (i = 1; i <= n; i++) own[s[i]] = 1 }
	/^\*/ { t = substr($0, 2); print; next }
	/^:/ { c = substr($1, 2); if ((t ":" c) in own) print (what == "rules" ? "-F " : "-X ") c; next }
	/^-A / && /meshwire-seed/ && what == "rules" { print "-D " substr($0, 4); next }
	/^COMMIT/ { print }'
}

# remove_part removes what one restore script of the seed added, with one
# tool (iptables-nft, ip6tables-nft, iptables-legacy).
remove_part() {
	seeded=$($1 | awk '/^\*/ { t = substr($0, 2) } /^:/ { print t ":" substr($1, 2) }' | tr '\n' ' ')
	"$2-save" 2>/dev/null | undo rules "$seeded" | "$2-restore" --noflush -w 10 &&
		"$2-save" 2>/dev/null | undo chains "$seeded" | "$2-restore" --noflush -w 10
}

case "${1:-}" in
add)
	# A seed left by an interrupted run goes first.
	"$0" remove
	v4_nft | iptables-nft-restore --noflush -w 10
	v6_nft | ip6tables-nft-restore --noflush -w 10
	v4_legacy | iptables-legacy-restore --noflush -w 10
	kube_nft | nft -f -
	echo "seed-host: Docker-, kube-proxy- and reference-portmap-style rules and a loaded legacy table added"
	;;
remove)
	# Each part on its own, so that one already gone does not keep the
	# others.
	st=0
	remove_part v4_nft iptables-nft || st=1
	remove_part v6_nft ip6tables-nft || st=1
	remove_part v4_legacy iptables-legacy || st=1
	if nft list table ip kube-proxy >/dev/null 2>&1; then
		nft delete table ip kube-proxy || st=1
	fi
	exit $st
	;;
*)
	echo "usage: $0 add|remove" >&2
	exit 2
	;;
esac
