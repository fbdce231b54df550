// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// A meshed pod's capture settings and the REDIRECT rules' verdict on an
// outbound connection, shared by capture.c (which captures at connect()
// by them) and fastpath.c (which mirrors them: it tracks an application's
// socket only when the rules captured its connection). The including file
// defines RULES_MAP(name), the names of its maps of pods, ports and ranges,
// which this header declares; both objects' maps have the same layout, and
// userspace (ebpf/capture/pods) writes them alike.
#ifndef MESHWIRE_CAPTURE_RULES_H
#define MESHWIRE_CAPTURE_RULES_H

#define DNS_SERVER_PORT 53

// Addresses are IPv6, IPv4 as v4-mapped (::ffff:a.b.c.d), network order.
struct addr {
	__u32 a[4];
};

#define MAX_OWNERS 8
#define MAX_GROUPS 64

enum capture_flag {
	CAP_OUT_ALL = 1 << 0,         // -i "*": every destination captured
	CAP_IN_ALL = 1 << 1,          // -b "*": every inbound port but the excluded
	CAP_IN = 1 << 2,              // inbound capture at all (-b not empty)
	CAP_LOOPBACK_INCLUDED = 1 << 3, // -i names a loopback range
	CAP_GROUPS_ONLY = 1 << 4,     // the owner groups are the only ones captured
	CAP_DNS = 1 << 5,             // DNS capture (redirect-dns)
	CAP_DNS_ALL = 1 << 6,         // to every server (capture-all-dns), else
	                              // to the CIDR_DNS ones (the nameservers)
	CAP_EBPF_MODE = 1 << 7,       // (the fast path's copy) EBPF interception:
	                              // the connect() hook captures, to loopback
	CAP_IPV4_ONLY = 1 << 8,       // IPv6 is left alone, as the rules have no
	                              // IPv6 half (a pod whose first address is
	                              // IPv4, without dual stack: istio-iptables'
	                              // decision); an entry without it (an older
	                              // build's) captures both families
};

// A meshed pod's capture settings (the pods map's value), from its config.
struct pod_capture {
	__u32 flags;          // enum capture_flag
	__u16 outbound_port;  // -p
	__u16 inbound_port;   // -z
	__u16 tunnel_port;    // -e (0: none)
	__u8 owners;          // entries of owner_id in use
	__u8 groups;          // entries of group in use
	__u32 owner_gid;      // bit i set: owner_id[i] is a gid, else a uid
	__u32 lo4;            // the IPv4 loopback range (network order) ...
	__u32 lo4_mask;       // ... and its mask
	__u32 owner_id[MAX_OWNERS]; // the proxy's uids then gids (-u, -g)
	__u32 group[MAX_GROUPS];    // the owner group filter's gids
	__u64 netns_ino;            // the namespace's nsfs inode: for userspace,
	                            // which forgets pods whose namespace is gone
};

enum port_kind {
	PORT_OUT_EXCLUDE = 1, // -o
	PORT_OUT_INCLUDE = 2, // -q
	PORT_IN_INCLUDE = 3,  // -b (a list)
	PORT_IN_EXCLUDE = 4,  // -d (with -b "*")
};

struct port_key {
	__u64 netns;
	__u16 port;
	__u8 kind; // enum port_kind
	__u8 pad[5];
};

enum cidr_kind {
	CIDR_EXCLUDE = 1, // -x
	CIDR_INCLUDE = 2, // -i (a list)
	CIDR_LOCAL = 3,   // the pod's own addresses: reached over lo
	CIDR_DNS = 4,     // the pod's nameservers (DNS capture without "all")
};

// The ranges map's key: the LPM prefix covers kind and netns whole, then the
// address's leading bits.
struct cidr_key {
	__u32 prefixlen;
	__u32 kind; // enum cidr_kind
	__u64 netns;
	struct addr addr;
};
#define CIDR_FULL (32 + 64 + 128)

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, struct pod_capture);
} RULES_MAP(pods) SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct port_key);
	__type(value, __u8);
} RULES_MAP(ports) SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, struct cidr_key);
	__type(value, __u8);
} RULES_MAP(cidrs) SEC(".maps");

static __always_inline void v4mapped(struct addr *a, __u32 ip4)
{
	a->a[0] = 0;
	a->a[1] = 0;
	a->a[2] = bpf_htonl(0xffff);
	a->a[3] = ip4;
}

static __always_inline int is_v4(const struct addr *a)
{
	return a->a[0] == 0 && a->a[1] == 0 && a->a[2] == bpf_htonl(0xffff);
}

static __always_inline int has_port(__u64 ns, __u8 kind, __u16 port)
{
	struct port_key k = {.netns = ns, .port = port, .kind = kind};
	return bpf_map_lookup_elem(&RULES_MAP(ports), &k) != 0;
}

static __always_inline int in_cidrs(__u64 ns, __u32 kind, const struct addr *a)
{
	struct cidr_key k = {.prefixlen = CIDR_FULL, .kind = kind, .netns = ns, .addr = *a};
	return bpf_map_lookup_elem(&RULES_MAP(cidrs), &k) != 0;
}

// is_local: a connection to a reaches it over lo (the rules' "-o lo"):
// 127.0.0.0/8, ::1, the unspecified address, or one of the pod's own.
static __always_inline int is_local(__u64 ns, const struct addr *a)
{
	if (is_v4(a)) {
		if ((bpf_ntohl(a->a[3]) >> 24) == 127 || a->a[3] == 0)
			return 1;
	} else if (a->a[0] == 0 && a->a[1] == 0 && a->a[2] == 0 && (a->a[3] == 0 || a->a[3] == bpf_htonl(1))) {
		return 1;
	}
	return in_cidrs(ns, CIDR_LOCAL, a);
}

// in_lo_range: a is in the pod's loopback range (-d of the rules' loopback
// RETURN): the IPv4 loopback CIDR, or ::1.
static __always_inline int in_lo_range(const struct pod_capture *pod, const struct addr *a)
{
	if (is_v4(a))
		return (a->a[3] & pod->lo4_mask) == pod->lo4;
	return a->a[0] == 0 && a->a[1] == 0 && a->a[2] == 0 && a->a[3] == bpf_htonl(1);
}

static __always_inline int addr_passthrough(const struct addr *a)
{
	if (is_v4(a))
		return a->a[3] == bpf_htonl(0x7f000006);
	return a->a[0] == 0 && a->a[1] == 0 && a->a[2] == 0 && a->a[3] == bpf_htonl(6);
}

enum verdict { LEAVE, TO_OUTBOUND, TO_INBOUND, TO_DNS };

// decide is the REDIRECT rules' verdict on an outbound TCP connection or
// UDP datagram, in the order of the ISTIO_OUTPUT chain
// (internal/intercept/build.go's run), for a destination of a family the
// rules have (none for IPv6 with CAP_IPV4_ONLY): excluded ports; the passthrough
// source; for each proxy owner, its TCP connections to the pod itself to
// the inbound port and the rest left alone, other loopback TCP left alone
// (with DNS capture: but port 53); the owner group filter; DNS; then, TCP
// only, the loopback range, excluded ranges, included ports, included
// ranges.
static __always_inline int decide(const struct pod_capture *pod, __u64 ns, const struct addr *dst, __u16 port,
				  const struct addr *src, __u32 uid, __u32 gid, int udp)
{
	if ((pod->flags & CAP_IPV4_ONLY) && !is_v4(dst))
		return LEAVE; // no IPv6 rules
	int dns = (pod->flags & CAP_DNS) != 0;
	if (udp && !dns)
		return LEAVE; // no UDP rule but DNS's
	if (has_port(ns, PORT_OUT_EXCLUDE, port))
		return LEAVE;
	int local = is_local(ns, dst);
	if (local && addr_passthrough(src))
		return LEAVE;
	int lo = in_lo_range(pod, dst);
	int dns_port = dns && port == DNS_SERVER_PORT;
	for (int i = 0; i < MAX_OWNERS; i++) {
		if (i >= pod->owners)
			break;
		__u32 id = pod->owner_id[i];
		int is_gid = (pod->owner_gid & (1u << i)) != 0;
		int match = is_gid ? gid == id : uid == id;
		if (match) {
			// The proxy's own DNS to its pod is not the inbound side's
			// for a uid owner (istio's "! --dport 53" with DNS capture).
			if (!udp && local && !lo && (pod->tunnel_port == 0 || port != pod->tunnel_port) &&
			    !(dns_port && !is_gid))
				return TO_INBOUND;
			return LEAVE;
		}
		if (!udp && local && !(pod->flags & CAP_LOOPBACK_INCLUDED) && !dns_port)
			return LEAVE;
	}
	if (pod->groups > 0 || (pod->flags & CAP_GROUPS_ONLY)) {
		int member = 0;
		for (int i = 0; i < MAX_GROUPS; i++) {
			if (i >= pod->groups)
				break;
			if (pod->group[i] == gid)
				member = 1;
		}
		if (member != !!(pod->flags & CAP_GROUPS_ONLY))
			return LEAVE;
	}
	if (dns_port && ((pod->flags & CAP_DNS_ALL) || in_cidrs(ns, CIDR_DNS, dst)))
		return TO_DNS;
	if (udp)
		return LEAVE;
	if (lo)
		return LEAVE;
	if (in_cidrs(ns, CIDR_EXCLUDE, dst))
		return LEAVE;
	if (has_port(ns, PORT_OUT_INCLUDE, port))
		return TO_OUTBOUND;
	if (pod->flags & CAP_OUT_ALL)
		return TO_OUTBOUND;
	if (in_cidrs(ns, CIDR_INCLUDE, dst))
		return TO_OUTBOUND;
	return LEAVE;
}

#endif
