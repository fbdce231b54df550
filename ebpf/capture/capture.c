//go:build ignore

// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// meshwire's interception without netfilter (the "ebpf" mode): a meshed
// pod's TCP connections reach its sidecar with no iptables or nftables rule
// in the pod's namespace, so conntrack never turns on there.
//
// Each meshed pod has an entry in mw_cap_pods under its network namespace
// cookie, written by the intercept plugin (or iptables-init) from the same
// settings the rules are built from; pods without one, and host processes,
// are never touched.
//
//   outbound: cgroup connect4/connect6 see an application's connect() and,
//             where the rules of REDIRECT mode would capture the
//             connection (the order of istio's ISTIO_OUTPUT chain), point
//             it at the sidecar's outbound port on loopback. The original
//             destination goes into the socket's local storage; sockops,
//             when the SYN is about to leave (the local port is known),
//             files it under the client's endpoint in mw_cap_origdst.
//   inbound:  a tc ingress program on the pod's interfaces hands a SYN to
//             a captured port to the sidecar's inbound listener with
//             bpf_sk_assign; the accepted socket keeps the original
//             destination as its local address, and the rest of the
//             connection is found by the kernel's own lookup.
//   IPv6:     captured both ways as IPv4 is, unless the pod's entry says
//             CAP_IPV4_ONLY: where the rules would have no IPv6 half (a
//             pod whose first address is IPv4, without dual stack), its
//             IPv6 is left alone, as theirs would be.
//   DNS:      with DNS capture, TCP and UDP to port 53 (of the pod's
//             nameservers, or any) go to the proxy's DNS port on loopback
//             instead: connect4/6 for TCP and connected UDP, sendmsg4/6
//             for datagrams sent with an address. The socket keeps the
//             server's address, and recvmsg4/6 and getpeername4/6 put it
//             back where the answers' source would show the proxy, as
//             conntrack's reverse translation does for the rules.
//   answers:  cgroup getsockopt answers SO_ORIGINAL_DST and
//             IP6T_SO_ORIGINAL_DST where conntrack has nothing: the filed
//             destination for a connection accepted on a capture port,
//             else the socket's local address (what conntrack reports for
//             a connection it did not rewrite). getpeername on a
//             redirected socket answers its original destination.
#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>

#define AF_INET 2
#define AF_INET6 10
#define SOCK_STREAM 1
#define SOCK_DGRAM 2
#define IPPROTO_TCP 6
#define IPPROTO_UDP 17
#define DNS_PORT 15053 // the proxy's DNS port (intercept.DNSCapturePort)
#define SOL_IP 0
#define SOL_IPV6 41
#define SO_ORIGINAL_DST 80 // also IP6T_SO_ORIGINAL_DST
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_HLEN 14
#define TC_ACT_OK 0
#define TC_ACT_SHOT 2

#include "sock_owner.h"

// The namespace of a packet's device: tc's bpf_get_netns_cookie answers
// for the initial namespace whatever the packet's, so the cookie is read
// from the kernel's sk_buff (bpf_cast_to_kern_ctx, Linux 6.3).
struct net {
	__u64 net_cookie;
} __attribute__((preserve_access_index));
typedef struct {
	struct net *net;
} possible_net_t;
struct net_device {
	possible_net_t nd_net;
} __attribute__((preserve_access_index));
struct sk_buff {
	struct net_device *dev;
} __attribute__((preserve_access_index));
extern void *bpf_cast_to_kern_ctx(void *) __ksym;

// Packet headers, only what is read.
struct iphdr {
	__u8 ihl_version;
	__u8 tos;
	__u16 tot_len;
	__u16 id;
	__u16 frag_off;
	__u8 ttl;
	__u8 protocol;
	__u16 check;
	__u32 saddr;
	__u32 daddr;
};
struct ipv6hdr {
	__u32 vtc_flow;
	__u16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__u32 saddr[4];
	__u32 daddr[4];
};
struct tcphdr {
	__u16 source;
	__u16 dest;
	__u32 seq;
	__u32 ack_seq;
	__u8 doff_res;
	__u8 flags; // FIN 0x01, SYN 0x02, RST 0x04, PSH 0x08, ACK 0x10
	__u16 window;
	__u16 check;
	__u16 urg_ptr;
};
#define TCP_SYN 0x02
#define TCP_ACK 0x10

struct sockaddr_in {
	__u16 sin_family;
	__u16 sin_port;
	__u32 sin_addr;
	__u8 zero[8];
};
struct sockaddr_in6 {
	__u16 sin6_family;
	__u16 sin6_port;
	__u32 sin6_flowinfo;
	__u32 sin6_addr[4];
	__u32 sin6_scope_id;
};

// The pods' settings and the rules' outbound verdict, shared with the fast
// path (which mirrors the rules to track only captured connections).
#define RULES_MAP(name) mw_cap_##name
#include "capture_rules.h"

// A client endpoint in a namespace (mw_cap_origdst's key).
struct endpoint {
	__u64 netns;
	struct addr addr;
	__u16 port; // host order
	__u8 pad[6];
};

// An original destination.
struct target {
	struct addr addr;
	__u16 port; // host order
	__u8 pad[2];
};

// Original destinations of redirected connections, under the client's
// endpoint. Entries are not removed when the connection closes (the proxy
// may ask after the client is gone); the next connect() from the same
// endpoint overwrites or removes its entry, and LRU bounds the rest.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct endpoint);
	__type(value, struct target);
} mw_cap_origdst SEC(".maps");

// A redirected socket's original destination (for UDP sent with an
// address: the last one captured) and the port it was sent to instead.
struct sk_target {
	struct target t;
	__u16 to; // 0: the socket's last connect() was not redirected
	__u8 pad[2];
};

// Per socket, from connect() (or sendmsg) for its life: sockops files it
// when the SYN leaves, recvmsg and getpeername answer from it.
struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sk_target);
} mw_cap_sk SEC(".maps");

enum counter {
	CC_OUTBOUND,  // connections sent to the outbound port
	CC_INBOUND_LO, // proxy connections to the pod sent to the inbound port
	CC_INBOUND,   // SYNs handed to the inbound listener
	CC_NO_LISTENER, // SYNs dropped: the inbound listener is not there yet
	CC_ANSWERS,   // SO_ORIGINAL_DST answered
	CC_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CC_MAX);
	__type(key, __u32);
	__type(value, __u64);
} mw_cap_counters SEC(".maps");

static __always_inline void count(__u32 c)
{
	__u64 *v = bpf_map_lookup_elem(&mw_cap_counters, &c);
	if (v)
		*v += 1;
}

extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym;

// owner reads the socket's owner as iptables' owner match sees it: the uid
// it was created with, the gid of the file it belongs to. A UDP socket has
// no checked conversion (bpf_skc_to_udp6_sock takes IPv6 sockets only), so
// it is read through a read-only cast (Linux 6.2).
static __always_inline void owner(struct bpf_sock *bsk, int udp, __u32 *uid, __u32 *gid)
{
	*uid = (__u32)-1;
	*gid = (__u32)-1;
	struct sock *sk;
	if (udp)
		sk = bpf_rdonly_cast(bsk, bpf_core_type_id_kernel(struct sock));
	else
		sk = (struct sock *)bpf_skc_to_tcp_sock(bsk);
	if (!sk)
		return;
	*uid = sk->sk_uid.val;
	struct socket *so = sk->sk_socket;
	if (!so)
		return;
	struct file *f = so->file;
	if (!f)
		return;
	const struct cred *c = f->f_cred;
	if (c)
		*gid = c->fsgid.val;
}

// forget marks the socket's connection as not redirected (a connect()
// that was not captured after one that was).
static __always_inline void forget(struct bpf_sock *sk)
{
	struct sk_target *t = bpf_sk_storage_get(&mw_cap_sk, sk, 0, 0);
	if (t)
		t->to = 0;
}

// redirect decides for a connect() (or, sendmsg, a datagram sent) to
// dst:port and, when captured, keeps the original destination with the
// socket and returns the port to send to instead on loopback (0: leave
// it).
static __always_inline __u16 redirect(struct bpf_sock_addr *ctx, const struct addr *dst, __u16 port, const struct addr *src,
				      int sendmsg)
{
	int udp;
	if (ctx->type == SOCK_STREAM && ctx->protocol == IPPROTO_TCP)
		udp = 0;
	else if (ctx->type == SOCK_DGRAM && ctx->protocol == IPPROTO_UDP)
		udp = 1;
	else
		return 0;
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return 0;
	__u64 ns = bpf_get_netns_cookie(ctx);
	struct pod_capture *pod = bpf_map_lookup_elem(&mw_cap_pods, &ns);
	if (!pod)
		return 0; // host processes and unmeshed pods: nothing more
	__u32 uid, gid;
	owner(sk, udp, &uid, &gid);
	__u16 to;
	switch (decide(pod, ns, dst, port, src, uid, gid, udp)) {
	case TO_OUTBOUND:
		to = pod->outbound_port;
		count(CC_OUTBOUND);
		break;
	case TO_INBOUND:
		to = pod->inbound_port;
		count(CC_INBOUND_LO);
		break;
	case TO_DNS:
		to = DNS_PORT; // not counted: the pinned counters map of layout v2 has no slot
		break;
	default:
		// A datagram to elsewhere leaves the socket's captured queries
		// be; a connect() elsewhere ends them.
		if (!sendmsg)
			forget(sk);
		return 0;
	}
	struct sk_target *t = bpf_sk_storage_get(&mw_cap_sk, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!t)
		return 0; // nowhere to keep the destination: not captured
	t->t.addr = *dst;
	t->t.port = port;
	t->to = to;
	return to;
}

// set_ip4 and set_ip6 point a sock_addr context at loopback:port, the
// IPv4 or IPv6 loopback address as dst's family has it (::ffff:127.0.0.1
// for an IPv4 destination of an IPv6 socket).
static __always_inline void set_ip4(struct bpf_sock_addr *ctx, __u16 port)
{
	ctx->user_ip4 = bpf_htonl(0x7f000001);
	ctx->user_port = bpf_htons(port);
}

static __always_inline void set_ip6(struct bpf_sock_addr *ctx, const struct addr *dst, __u16 port)
{
	ctx->user_ip6[0] = 0;
	ctx->user_ip6[1] = 0;
	if (is_v4(dst)) {
		ctx->user_ip6[2] = bpf_htonl(0xffff);
		ctx->user_ip6[3] = bpf_htonl(0x7f000001);
	} else {
		ctx->user_ip6[2] = 0;
		ctx->user_ip6[3] = bpf_htonl(1);
	}
	ctx->user_port = bpf_htons(port);
}

static __always_inline void addr6_of(struct bpf_sock_addr *ctx, struct addr *a)
{
	a->a[0] = ctx->user_ip6[0];
	a->a[1] = ctx->user_ip6[1];
	a->a[2] = ctx->user_ip6[2];
	a->a[3] = ctx->user_ip6[3];
}

static __always_inline void src6_of(struct bpf_sock_addr *ctx, struct addr *src)
{
	struct bpf_sock *sk = ctx->sk;
	if (sk) {
		src->a[0] = sk->src_ip6[0];
		src->a[1] = sk->src_ip6[1];
		src->a[2] = sk->src_ip6[2];
		src->a[3] = sk->src_ip6[3];
	}
}

static __always_inline int out4(struct bpf_sock_addr *ctx, int sendmsg)
{
	struct addr dst, src;
	v4mapped(&dst, ctx->user_ip4);
	if (sendmsg)
		v4mapped(&src, ctx->msg_src_ip4);
	else
		v4mapped(&src, ctx->sk ? ctx->sk->src_ip4 : 0);
	__u16 to = redirect(ctx, &dst, bpf_ntohs((__u16)ctx->user_port), &src, sendmsg);
	if (to)
		set_ip4(ctx, to);
	return 1;
}

static __always_inline int out6(struct bpf_sock_addr *ctx, int sendmsg)
{
	struct addr dst, src = {};
	addr6_of(ctx, &dst);
	if (sendmsg) {
		src.a[0] = ctx->msg_src_ip6[0];
		src.a[1] = ctx->msg_src_ip6[1];
		src.a[2] = ctx->msg_src_ip6[2];
		src.a[3] = ctx->msg_src_ip6[3];
	} else {
		src6_of(ctx, &src);
	}
	__u16 to = redirect(ctx, &dst, bpf_ntohs((__u16)ctx->user_port), &src, sendmsg);
	if (to)
		set_ip6(ctx, &dst, to);
	return 1;
}

SEC("cgroup/connect4")
int mw_connect4(struct bpf_sock_addr *ctx) { return out4(ctx, 0); }

SEC("cgroup/connect6")
int mw_connect6(struct bpf_sock_addr *ctx) { return out6(ctx, 0); }

SEC("cgroup/sendmsg4")
int mw_sendmsg4(struct bpf_sock_addr *ctx) { return out4(ctx, 1); }

SEC("cgroup/sendmsg6")
int mw_sendmsg6(struct bpf_sock_addr *ctx) { return out6(ctx, 1); }

// original: where a redirected socket sees loopback:port (the address a
// datagram came from, or its peer), the destination it was redirected
// from; 0 when the socket's traffic to there was not redirected.
static __always_inline struct target *original(struct bpf_sock_addr *ctx, const struct addr *seen)
{
	struct bpf_sock *sk = ctx->sk;
	if (!sk)
		return 0;
	struct sk_target *t = bpf_sk_storage_get(&mw_cap_sk, sk, 0, 0);
	if (!t || t->to == 0 || bpf_ntohs((__u16)ctx->user_port) != t->to)
		return 0;
	if (is_v4(seen)) {
		if (seen->a[3] != bpf_htonl(0x7f000001))
			return 0;
	} else if (seen->a[0] != 0 || seen->a[1] != 0 || seen->a[2] != 0 || seen->a[3] != bpf_htonl(1)) {
		return 0;
	}
	return &t->t;
}

static __always_inline int back4(struct bpf_sock_addr *ctx)
{
	struct addr seen;
	v4mapped(&seen, ctx->user_ip4);
	struct target *t = original(ctx, &seen);
	if (t && is_v4(&t->addr)) {
		ctx->user_ip4 = t->addr.a[3];
		ctx->user_port = bpf_htons(t->port);
	}
	return 1;
}

static __always_inline int back6(struct bpf_sock_addr *ctx)
{
	struct addr seen;
	addr6_of(ctx, &seen);
	struct target *t = original(ctx, &seen);
	if (t) {
		ctx->user_ip6[0] = t->addr.a[0];
		ctx->user_ip6[1] = t->addr.a[1];
		ctx->user_ip6[2] = t->addr.a[2];
		ctx->user_ip6[3] = t->addr.a[3];
		ctx->user_port = bpf_htons(t->port);
	}
	return 1;
}

SEC("cgroup/recvmsg4")
int mw_recvmsg4(struct bpf_sock_addr *ctx) { return back4(ctx); }

SEC("cgroup/recvmsg6")
int mw_recvmsg6(struct bpf_sock_addr *ctx) { return back6(ctx); }

SEC("cgroup/getpeername4")
int mw_getpeername4(struct bpf_sock_addr *ctx) { return back4(ctx); }

SEC("cgroup/getpeername6")
int mw_getpeername6(struct bpf_sock_addr *ctx) { return back6(ctx); }

// mw_cap_ops files a redirected socket's original destination under its
// endpoint when the SYN is about to leave, and forgets any earlier one of
// that endpoint for a connection that was not redirected. The socket keeps
// its own (for getpeername).
SEC("sockops")
int mw_cap_ops(struct bpf_sock_ops *skops)
{
	if (skops->op != BPF_SOCK_OPS_TCP_CONNECT_CB)
		return 1;
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return 1;
	__u64 ns = bpf_get_netns_cookie(skops);
	if (!bpf_map_lookup_elem(&mw_cap_pods, &ns))
		return 1;
	// Every field read before the branch: the verifier refuses a context
	// pointer the compiler moved to the field.
	__u32 family = skops->family, ip4 = skops->local_ip4;
	struct endpoint e = {.netns = ns, .port = skops->local_port};
	e.addr.a[0] = skops->local_ip6[0];
	e.addr.a[1] = skops->local_ip6[1];
	e.addr.a[2] = skops->local_ip6[2];
	e.addr.a[3] = skops->local_ip6[3];
	if (family == AF_INET)
		v4mapped(&e.addr, ip4);
	struct sk_target *t = bpf_sk_storage_get(&mw_cap_sk, sk, 0, 0);
	if (t && t->to) {
		bpf_map_update_elem(&mw_cap_origdst, &e, &t->t, BPF_ANY);
	} else {
		bpf_map_delete_elem(&mw_cap_origdst, &e);
	}
	return 1;
}

SEC("cgroup/getsockopt")
int mw_getsockopt(struct bpf_sockopt *ctx)
{
	if (ctx->optname != SO_ORIGINAL_DST || (ctx->level != SOL_IP && ctx->level != SOL_IPV6))
		return 1;
	if (ctx->retval == 0)
		return 1; // conntrack answered
	struct bpf_sock *sk = ctx->sk;
	if (!sk || sk->protocol != IPPROTO_TCP)
		return 1;
	if (sk->state != BPF_TCP_ESTABLISHED && sk->state != BPF_TCP_CLOSE_WAIT)
		return 1;
	__u64 ns = bpf_get_netns_cookie(ctx);
	struct pod_capture *pod = bpf_map_lookup_elem(&mw_cap_pods, &ns);
	if (!pod)
		return 1;
	// Every field read before the branches: the verifier refuses a
	// socket pointer the compiler moved to a field.
	__u32 family = sk->family, src4 = sk->src_ip4, dst4 = sk->dst_ip4;
	__u32 src6[4] = {sk->src_ip6[0], sk->src_ip6[1], sk->src_ip6[2], sk->src_ip6[3]};
	__u32 dst6[4] = {sk->dst_ip6[0], sk->dst_ip6[1], sk->dst_ip6[2], sk->dst_ip6[3]};
	__u16 sport = sk->src_port, dport = bpf_ntohs(sk->dst_port);
	struct target t = {.addr = {{src6[0], src6[1], src6[2], src6[3]}}, .port = sport};
	struct endpoint e = {.netns = ns, .addr = {{dst6[0], dst6[1], dst6[2], dst6[3]}}, .port = dport};
	if (family == AF_INET) {
		v4mapped(&t.addr, src4);
		v4mapped(&e.addr, dst4);
	}
	if (t.port == pod->outbound_port || t.port == pod->inbound_port || t.port == DNS_PORT) {
		struct target *filed = bpf_map_lookup_elem(&mw_cap_origdst, &e);
		if (filed)
			t = *filed;
	}
	if (ctx->level == SOL_IP) {
		if (!is_v4(&t.addr))
			return 1;
		struct sockaddr_in *sin = ctx->optval;
		if ((void *)(sin + 1) > ctx->optval_end)
			return 1;
		__builtin_memset(sin, 0, sizeof(*sin));
		sin->sin_family = AF_INET;
		sin->sin_port = bpf_htons(t.port);
		sin->sin_addr = t.addr.a[3];
		ctx->optlen = sizeof(*sin);
	} else {
		if (is_v4(&t.addr))
			return 1;
		struct sockaddr_in6 *sin6 = ctx->optval;
		if ((void *)(sin6 + 1) > ctx->optval_end)
			return 1;
		__builtin_memset(sin6, 0, sizeof(*sin6));
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = bpf_htons(t.port);
		sin6->sin6_addr[0] = t.addr.a[0];
		sin6->sin6_addr[1] = t.addr.a[1];
		sin6->sin6_addr[2] = t.addr.a[2];
		sin6->sin6_addr[3] = t.addr.a[3];
		ctx->optlen = sizeof(*sin6);
	}
	ctx->retval = 0;
	count(CC_ANSWERS);
	return 1;
}

// captured_inbound: the inbound rules (REDIRECT mode) capture a connection
// to port.
static __always_inline int captured_inbound(const struct pod_capture *pod, __u64 ns, __u16 port)
{
	if (!(pod->flags & CAP_IN))
		return 0;
	if (pod->tunnel_port != 0 && port == pod->tunnel_port)
		return 0;
	if (pod->flags & CAP_IN_ALL)
		return !has_port(ns, PORT_IN_EXCLUDE, port);
	return has_port(ns, PORT_IN_INCLUDE, port);
}

// mw_cap_ingress, on a meshed pod's interfaces: a SYN to a captured port
// goes to the inbound listener; with no listener yet it is dropped (the
// client retries), never let past the sidecar.
SEC("tc")
int mw_cap_ingress(struct __sk_buff *skb)
{
	struct sk_buff *kskb = bpf_cast_to_kern_ctx(skb);
	struct net_device *dev = kskb->dev;
	if (!dev)
		return TC_ACT_OK;
	__u64 ns = dev->nd_net.net->net_cookie;
	struct pod_capture *pod = bpf_map_lookup_elem(&mw_cap_pods, &ns);
	if (!pod || !(pod->flags & CAP_IN))
		return TC_ACT_OK;
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct bpf_sock_tuple tuple = {};
	__u32 tuple_len;
	struct tcphdr *th;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = data + ETH_HLEN;
		if ((void *)(ip + 1) > end || ip->protocol != IPPROTO_TCP)
			return TC_ACT_OK;
		if (ip->frag_off & bpf_htons(0x1fff))
			return TC_ACT_OK;
		th = (void *)ip + (ip->ihl_version & 0x0f) * 4;
		if ((void *)(th + 1) > end)
			return TC_ACT_OK;
		tuple.ipv4.saddr = ip->saddr;
		tuple.ipv4.daddr = ip->daddr;
		tuple.ipv4.sport = th->source;
		tuple.ipv4.dport = bpf_htons(pod->inbound_port);
		tuple_len = sizeof(tuple.ipv4);
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		if (pod->flags & CAP_IPV4_ONLY)
			return TC_ACT_OK; // no IPv6 rules
		struct ipv6hdr *ip6 = data + ETH_HLEN;
		if ((void *)(ip6 + 1) > end || ip6->nexthdr != IPPROTO_TCP)
			return TC_ACT_OK;
		th = (void *)(ip6 + 1);
		if ((void *)(th + 1) > end)
			return TC_ACT_OK;
		__builtin_memcpy(tuple.ipv6.saddr, ip6->saddr, 16);
		__builtin_memcpy(tuple.ipv6.daddr, ip6->daddr, 16);
		tuple.ipv6.sport = th->source;
		tuple.ipv6.dport = bpf_htons(pod->inbound_port);
		tuple_len = sizeof(tuple.ipv6);
	} else {
		return TC_ACT_OK;
	}
	if ((th->flags & (TCP_SYN | TCP_ACK)) != TCP_SYN)
		return TC_ACT_OK; // established flows find their socket themselves
	if (!captured_inbound(pod, ns, bpf_ntohs(th->dest)))
		return TC_ACT_OK;
	struct bpf_sock *sk = bpf_skc_lookup_tcp(skb, &tuple, tuple_len, BPF_F_CURRENT_NETNS, 0);
	if (!sk) {
		count(CC_NO_LISTENER);
		return TC_ACT_SHOT;
	}
	if (sk->state != BPF_TCP_LISTEN) {
		bpf_sk_release(sk);
		count(CC_NO_LISTENER);
		return TC_ACT_SHOT;
	}
	long err = bpf_sk_assign(skb, sk, 0);
	bpf_sk_release(sk);
	if (err) {
		count(CC_NO_LISTENER);
		return TC_ACT_SHOT;
	}
	count(CC_INBOUND);
	return TC_ACT_OK;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
