//go:build ignore

// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// meshwire's sockmap fast path: the bytes between an application and its
// sidecar proxy in the same pod skip the TCP/IP stack and netfilter.
//
// sockops (attached at the cgroup v2 root) sees every TCP socket reach
// ESTABLISHED and puts the two ends of each app <-> sidecar connection into
// mw_socks, a sockhash keyed by (network namespace cookie, endpoint, role):
//
//   outbound: the app's socket (client, key = its local address) and the
//             proxy's socket accepted on the outbound capture port (server,
//             key = its remote address, which is the app's local address);
//   inbound:  the proxy's passthrough socket bound to 127.0.0.6 / ::6
//             (client, key = its local address) and the app's accepted
//             socket (server, key = its remote address).
//
// Keys carry the client socket's cookie, so each key names one connection:
// the server end, when established, finds the client's cookie through
// mw_endpoints (client endpoint -> cookie) and is keyed with it; an endpoint
// two live client sockets share (connect() may reuse a local port toward
// another destination) is never paired. sk_msg (attached to mw_socks) hands
// each message of a paired socket to its peer's receive queue with
// bpf_msg_redirect_hash(BPF_F_INGRESS).
//
// Order: a direction starts on TCP when its first message races the
// pairing, and moves to the fast path only when its receiver had read every
// byte the sender ever wrote on TCP (the receiver's copied_seq, published
// when it was established and each time it sends, equals the sender's
// write_seq, and their 64-bit byte counts agree: sequence numbers alone
// would also match 2^32 bytes apart); once on the fast path it stays there. Turning the fast path
// off (draining) moves new messages back to TCP, which keeps their order: a
// receiver reads its psock queue before its TCP queue.
//
// Sidecar to sidecar: a connection between two meshed pods of this node
// (from the client pod's proxy to the server pod's address) is paired
// across the two namespaces, so that its bytes skip both stacks, the veth
// pair and the bridge. When the server pod's namespace receives the SYN
// (a request socket, before the SYN-ACK), mw_peer_syns notes the client
// endpoint; the client's socket, established next, is keyed by that
// endpoint with no namespace (ROLE_PEER_CLIENT) and files in
// mw_endpoints both initial sequence numbers it saw; the server's socket
// pairs with it (ROLE_PEER_SERVER) only if it saw the same two (its
// rcv_nxt and snd_una less the bytes since): two sockets that agree on
// both random ISNs are the two ends of one connection, whatever other
// namespace of the node uses the same addresses. Both pods need a policy
// in mw_pods (the chained plugin's: meshed pods) without POD_NO_PEER
// (a pod whose traffic the node shapes keeps its bytes on its veth).
//
// splice(): bytes handed over wait in the receiver's psock queue, which
// splice() (tcp_read_sock) never reads, and this kernel offers no hook
// (fentry) to tell a splicing reader from a recvmsg one. The proxy's sockets
// are therefore fed only with into_proxy set (for proxies known to read with
// recv/readv, as Envoy does): for every pod with into_proxy set, or for
// the pods whose entry in mw_pods says so (the intercept plugin writes one
// per meshed pod, keyed by its network namespace cookie); otherwise only
// the application's sockets are, in the sidecar -> app direction.
#include <linux/bpf.h>
#include <linux/types.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>

#define AF_INET 2
#define AF_INET6 10

#include "sock_owner.h"

// The meshed pods' interception settings, mirrored (mw_rules_pods, _ports,
// _cidrs; the intercept plugin writes them beside the policy): an
// application's connection is tracked only when the pod's interception
// captured it, so that connections to excluded ports and ranges pay
// nothing. A pod without them has every connection tracked (the sidecar's
// accept pairs only the captured ones).
#define RULES_MAP(name) mw_rules_##name
#include "capture_rules.h"

// Kernel types, only the fields read here; CO-RE relocates their offsets
// against the running kernel's BTF.
struct tcp_sock {
	__u32 copied_seq;
	__u32 rcv_nxt;
	__u32 snd_una;
	__u32 write_seq;
	__u64 bytes_received; // in-order bytes received (rcv_nxt's 64-bit count)
	__u64 bytes_acked;    // bytes the peer acknowledged (snd_una's)
} __attribute__((preserve_access_index));

// Set by the loader before the programs are loaded.
volatile const __u32 proxy_uid = 1337;
// With match_gid, a socket of the proxy's gid (iptables-init's
// --proxy-gid) is the proxy's too, whatever its uid.
volatile const __u32 proxy_gid = 1337;
volatile const __u8 match_gid = 0;
volatile const __u16 outbound_port = 15001;
// Also redirect into the proxy's sockets (the app -> sidecar direction).
// Off by default: bytes the fast path hands over wait in the receiver's
// psock queue, which splice() never reads, and many proxies copy with
// splice (Go's io.Copy between two TCP connections does).
volatile const __u8 into_proxy = 0;

enum role { ROLE_CLIENT = 1, ROLE_SERVER = 2, ROLE_PEER_CLIENT = 3, ROLE_PEER_SERVER = 4 };

struct sock_key {
	__u64 netns;
	__u32 addr[4];   // IPv4 in addr[0]; network byte order
	__u16 port;      // host byte order
	__u8 family;     // AF_INET or AF_INET6 (v4-mapped IPv6 is AF_INET)
	__u8 role;
	__u32 pad;
	__u64 client;    // the client end's socket cookie: keys are per connection
};

// The endpoint of a connection in a namespace: a sock_key without role and
// client cookie.
struct endpoint {
	__u64 netns;
	__u32 addr[4];
	__u16 port;
	__u8 family;
	__u8 pad[5];
};

struct endpoint_use {
	__u64 client;   // cookie of the client socket that holds it
	__u64 sockets;  // live client sockets with this endpoint
	// Of a peer client (sidecar to sidecar): its snd_una and rcv_nxt when
	// it was established, its ISN + 1 and its server's.
	__u32 client_isn;
	__u32 server_isn;
};

enum state_flag {
	F_FAST = 1 << 0,     // this direction sends on the fast path
	F_CLIENT = 1 << 1,   // holds a reference in mw_endpoints
};

// Per socket of mw_socks, in its socket-local storage (freed with it).
struct sock_state {
	struct sock_key self; // its key in mw_socks and mw_readers
	struct sock_key peer; // the other end's key
	__u64 flags;          // enum state_flag, changed with atomic or only
};

// How far a socket of mw_socks has read its TCP stream, for its peer's
// sk_msg program (which cannot reach the socket itself): its copied_seq
// when it was established and each time it sent a message since, and the
// same position as a 64-bit count of bytes. Kept in mw_readers under its
// key.
struct reader {
	__u32 copied;
	__u32 proxy;   // owned by the proxy's uid
	__u64 read;    // bytes read: bytes_received - (rcv_nxt - copied_seq)
	__u64 netns;   // its network namespace cookie (its pod's policy)
};

// A meshed pod's fast-path policy, in mw_pods under its network namespace
// cookie.
enum pod_flag {
	POD_INTO_PROXY = 1 << 0, // its proxy may be fed (it reads with recv/readv)
	POD_NO_PEER = 1 << 1,    // never paired with another pod (sidecar to sidecar)
};

struct pod_policy {
	__u32 flags;    // enum pod_flag
	__u32 netns_ino; // the namespace's nsfs inode, for the node agent's GC
};

enum counter {
	C_SOCKETS,      // sockets put into mw_socks
	C_PAIRS,        // connections whose two ends were bound
	C_MESSAGES,     // messages redirected
	C_BYTES,        // bytes redirected
	C_FALLBACKS,    // messages of tracked sockets sent on TCP
	C_AMBIGUOUS,    // client sockets that shared an endpoint with another
	C_KEPT_FOR_PROXY, // of those, messages to the proxy (into_proxy off)
	C_PEER_PAIRS,   // of C_PAIRS, connections between two pods' sidecars
	C_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_SOCKHASH);
	__uint(max_entries, 65536);
	__type(key, struct sock_key);
	__type(value, __u64);
} mw_socks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct sock_state);
} mw_state SEC(".maps");

// Meshed pods' policies, written by the intercept plugin at ADD and removed
// at DEL. An entry whose namespace went before its DEL names a cookie the
// kernel never hands out again: the node agent removes it (by netns_ino),
// and LRU lets such entries go first.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct pod_policy);
} mw_pods SEC(".maps");

// Network namespaces where a sidecar listens on the outbound capture port.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64);
	__type(value, __u8);
} mw_sidecars SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct sock_key);
	__type(value, struct reader);
} mw_readers SEC(".maps");

// Client endpoints (no namespace) of SYNs a meshed pod's namespace
// received, until the client's socket is established; LRU lets those of
// connections that never were go.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, struct endpoint);
	__type(value, __u64); // the server's namespace cookie
} mw_peer_syns SEC(".maps");

// Client endpoints in use; the entry goes when its last socket closes.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, struct endpoint);
	__type(value, struct endpoint_use);
} mw_endpoints SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, C_MAX);
	__type(key, __u32);
	__type(value, __u64);
} mw_counters SEC(".maps");

// mw_control[0]: written by the loader. draining != 0 stops new sockets
// and new redirects; the rest records what attach was given, for status.
struct control {
	__u32 draining;
	__u32 proxy_uid;
	__u16 outbound_port;
	__u8 into_proxy;
	__u8 match_gid;  // was padding: an earlier build leaves it 0
	__u32 proxy_gid;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct control);
} mw_control SEC(".maps");

static __always_inline void count(__u32 c, __u64 n)
{
	__u64 *v = bpf_map_lookup_elem(&mw_counters, &c);
	if (v)
		*v += n;
}

static __always_inline int draining(void)
{
	__u32 zero = 0;
	struct control *c = bpf_map_lookup_elem(&mw_control, &zero);
	return c && c->draining;
}

static __always_inline void set_addr(struct endpoint *e, __u32 family, __u32 ip4, const __u32 *ip6)
{
	if (family == AF_INET) {
		e->family = AF_INET;
		e->addr[0] = ip4;
		return;
	}
	if (ip6[0] == 0 && ip6[1] == 0 && ip6[2] == bpf_htonl(0xffff)) {
		e->family = AF_INET;
		e->addr[0] = ip6[3];
		return;
	}
	e->family = AF_INET6;
	e->addr[0] = ip6[0];
	e->addr[1] = ip6[1];
	e->addr[2] = ip6[2];
	e->addr[3] = ip6[3];
}

// The sidecar's passthrough source address: 127.0.0.6 or ::6.
static __always_inline int is_passthrough(const struct endpoint *e)
{
	if (e->family == AF_INET)
		return e->addr[0] == bpf_htonl(0x7f000006);
	return e->addr[0] == 0 && e->addr[1] == 0 && e->addr[2] == 0 && e->addr[3] == bpf_htonl(6);
}

static __always_inline int is_loopback(const struct endpoint *e)
{
	if (e->family == AF_INET)
		return (bpf_ntohl(e->addr[0]) >> 24) == 127;
	return e->addr[0] == 0 && e->addr[1] == 0 && e->addr[2] == 0 && e->addr[3] == bpf_htonl(1);
}

static __always_inline void local_endpoint(struct bpf_sock_ops *skops, struct endpoint *e)
{
	__u32 ip6[4] = {skops->local_ip6[0], skops->local_ip6[1], skops->local_ip6[2], skops->local_ip6[3]};
	e->netns = bpf_get_netns_cookie(skops);
	set_addr(e, skops->family, skops->local_ip4, ip6);
	e->port = skops->local_port;
}

static __always_inline void remote_endpoint(struct bpf_sock_ops *skops, struct endpoint *e)
{
	__u32 ip6[4] = {skops->remote_ip6[0], skops->remote_ip6[1], skops->remote_ip6[2], skops->remote_ip6[3]};
	e->netns = bpf_get_netns_cookie(skops);
	set_addr(e, skops->family, skops->remote_ip4, ip6);
	e->port = bpf_ntohl(skops->remote_port);
}

static __always_inline void key_of(struct sock_key *k, const struct endpoint *e, __u8 role, __u64 client)
{
	k->netns = e->netns;
	k->addr[0] = e->addr[0];
	k->addr[1] = e->addr[1];
	k->addr[2] = e->addr[2];
	k->addr[3] = e->addr[3];
	k->port = e->port;
	k->family = e->family;
	k->role = role;
	k->client = client;
}

// owner_ids reads the socket's owner as iptables' owner match sees it: the
// uid it was created with (an accepted socket inherits its listener's),
// the file-system gid of the file it belongs to (none, -1, for a socket
// accepted but not yet returned by accept()).
static __always_inline int owner_ids(struct bpf_sock *bsk, __u32 *uid, __u32 *gid)
{
	*uid = (__u32)-1;
	*gid = (__u32)-1;
	struct sock *sk = (struct sock *)bpf_skc_to_tcp_sock(bsk);
	if (!sk)
		return 0;
	*uid = sk->sk_uid.val;
	struct socket *so = sk->sk_socket;
	if (!so)
		return 1;
	struct file *f = so->file;
	if (!f)
		return 1;
	const struct cred *c = f->f_cred;
	if (c)
		*gid = c->fsgid.val;
	return 1;
}

// owned_by_proxy: the socket was created by the proxy's uid, or with
// match_gid belongs to a file opened with the proxy's gid
// (server_established relies on the sidecar's listener for a socket not
// yet accepted).
static __always_inline __u32 owned_by_proxy(struct bpf_sock *bsk)
{
	__u32 uid, gid;
	if (!owner_ids(bsk, &uid, &gid))
		return 0;
	return uid == proxy_uid || (match_gid && gid == proxy_gid);
}

// endpoint_of is key_of's inverse: the endpoint a key was made of.
static __always_inline void endpoint_of(struct endpoint *e, const struct sock_key *k)
{
	e->netns = k->netns;
	e->addr[0] = k->addr[0];
	e->addr[1] = k->addr[1];
	e->addr[2] = k->addr[2];
	e->addr[3] = k->addr[3];
	e->port = k->port;
	e->family = k->family;
}

static __always_inline void mark_sidecar(struct bpf_sock_ops *skops)
{
	__u64 ns = bpf_get_netns_cookie(skops);
	__u8 one = 1;
	bpf_map_update_elem(&mw_sidecars, &ns, &one, BPF_ANY);
}

// track records a socket just put into mw_socks: its key, a reader entry
// with nothing read yet, and a callback when it closes.
static __always_inline void track(struct bpf_sock_ops *skops, struct bpf_sock *sk, struct sock_state *st, const struct sock_key *k, __u32 proxy)
{
	// Nothing read yet: copied_seq == rcv_nxt on a socket just established.
	struct reader r = {.copied = skops->rcv_nxt, .proxy = proxy, .netns = bpf_get_netns_cookie(skops)};
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	if (tp)
		r.read = tp->bytes_received;
	st->self = *k;
	bpf_map_update_elem(&mw_readers, k, &r, BPF_ANY);
	bpf_sock_ops_cb_flags_set(skops, skops->bpf_sock_ops_cb_flags | BPF_SOCK_OPS_STATE_CB_FLAG);
	count(C_SOCKETS, 1);
}

// peers_allowed: the pod of network namespace ns is meshed (has a policy)
// and may be paired with another pod's sidecar.
static __always_inline int peers_allowed(__u64 ns)
{
	struct pod_policy *p = bpf_map_lookup_elem(&mw_pods, &ns);
	return p && !(p->flags & POD_NO_PEER);
}

// peer_syn notes a SYN that a meshed pod's namespace received (skops is
// its request socket): the client's socket may be another pod's sidecar.
static __always_inline void peer_syn(struct bpf_sock_ops *skops)
{
	__u64 ns = bpf_get_netns_cookie(skops);
	if (!bpf_map_lookup_elem(&mw_sidecars, &ns) || !peers_allowed(ns))
		return;
	struct endpoint c = {};
	remote_endpoint(skops, &c);
	if (is_loopback(&c))
		return;
	c.netns = 0;
	bpf_map_update_elem(&mw_peer_syns, &c, &ns, BPF_ANY);
}

// track_client puts a client socket into mw_socks under endpoint e (its
// local one) and role, and files its endpoint in mw_endpoints with the
// sequence numbers it saw (for a peer client).
static __always_inline void track_client(struct bpf_sock_ops *skops, struct bpf_sock *sk, const struct endpoint *e, __u8 role, __u32 proxy)
{
	struct sock_state *st = bpf_sk_storage_get(&mw_state, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st)
		return;
	__u64 cookie = bpf_get_socket_cookie(skops);
	struct sock_key k = {};
	key_of(&k, e, role, cookie);
	if (bpf_sock_hash_update(skops, &mw_socks, &k, BPF_NOEXIST) != 0)
		return;
	track(skops, sk, st, &k, proxy);
	// The server end's key carries this socket's cookie: it exists once
	// that end has paired with this socket, and names no other.
	key_of(&st->peer, e, role + 1, cookie);
	// Count the endpoint's users; the close callback gives it back.
	struct endpoint_use use = {.client = cookie, .sockets = 1, .client_isn = skops->snd_una, .server_isn = skops->rcv_nxt};
	if (bpf_map_update_elem(&mw_endpoints, e, &use, BPF_NOEXIST) != 0) {
		struct endpoint_use *u = bpf_map_lookup_elem(&mw_endpoints, e);
		if (!u)
			return;
		__sync_fetch_and_add(&u->sockets, 1);
		count(C_AMBIGUOUS, 1);
	}
	__sync_fetch_and_or(&st->flags, F_CLIENT);
}

static __always_inline void addr_of(struct addr *a, const struct endpoint *e)
{
	if (e->family == AF_INET) {
		v4mapped(a, e->addr[0]);
		return;
	}
	a->a[0] = e->addr[0];
	a->a[1] = e->addr[1];
	a->a[2] = e->addr[2];
	a->a[3] = e->addr[3];
}

// captured reports whether the pod's interception captured the
// application's connection from local to remote, by the pod's mirrored
// settings: in EBPF mode the connect() hook pointed it at the outbound
// port on loopback; with rules, the rules' verdict. Without settings, yes.
static __always_inline int captured(struct bpf_sock *sk, const struct endpoint *local, const struct endpoint *remote)
{
	struct pod_capture *pod = bpf_map_lookup_elem(&mw_rules_pods, &local->netns);
	if (!pod)
		return 1;
	if (pod->flags & CAP_EBPF_MODE)
		return is_loopback(remote) && remote->port == outbound_port;
	struct addr dst = {}, src = {};
	addr_of(&dst, remote);
	addr_of(&src, local);
	__u32 uid, gid;
	owner_ids(sk, &uid, &gid);
	return decide(pod, local->netns, &dst, remote->port, &src, uid, gid, 0) == TO_OUTBOUND;
}

static __always_inline void client_established(struct bpf_sock_ops *skops)
{
	struct endpoint e = {}, remote = {};
	local_endpoint(skops, &e);
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return;
	__u32 proxy = owned_by_proxy(sk);
	if (is_passthrough(&e)) {
		// The sidecar's connection to its application (inbound).
		if (!proxy)
			return;
		track_client(skops, sk, &e, ROLE_CLIENT, proxy);
		return;
	}
	remote_endpoint(skops, &remote);
	if (proxy) {
		// The sidecar's own connection: to another meshed pod of this
		// node, whose namespace noted the SYN, it is a peer client.
		struct endpoint c = e;
		c.netns = 0;
		if (is_loopback(&remote) || !peers_allowed(e.netns) || !bpf_map_lookup_elem(&mw_peer_syns, &c))
			return;
		bpf_map_delete_elem(&mw_peer_syns, &c);
		track_client(skops, sk, &c, ROLE_PEER_CLIENT, proxy);
		return;
	}
	// An application's outbound connection: only in a namespace with a
	// sidecar, not to loopback except to the sidecar's outbound port,
	// where EBPF interception's connect() hook points a captured
	// connection (127.0.0.1 or ::1).
	if (!bpf_map_lookup_elem(&mw_sidecars, &e.netns))
		return;
	if (is_loopback(&remote) && remote.port != outbound_port)
		return;
	if (!captured(sk, &e, &remote))
		return;
	track_client(skops, sk, &e, ROLE_CLIENT, proxy);
}

static __always_inline void closed(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return;
	struct sock_state *st = bpf_sk_storage_get(&mw_state, sk, 0, 0);
	if (!st)
		return;
	bpf_map_delete_elem(&mw_readers, &st->self);
	if (!(st->flags & F_CLIENT))
		return;
	__sync_fetch_and_and(&st->flags, ~(__u64)F_CLIENT);
	// A client's own key holds its endpoint.
	struct endpoint e = {};
	endpoint_of(&e, &st->self);
	struct endpoint_use *u = bpf_map_lookup_elem(&mw_endpoints, &e);
	if (u && __sync_fetch_and_add(&u->sockets, -1) == 1)
		bpf_map_delete_elem(&mw_endpoints, &e);
}

// track_server puts a server socket into mw_socks under its client's
// endpoint e and role, paired with client socket cookie client.
static __always_inline void track_server(struct bpf_sock_ops *skops, struct bpf_sock *sk, const struct endpoint *e, __u8 role, __u64 client, __u32 proxy)
{
	struct sock_state *st = bpf_sk_storage_get(&mw_state, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!st)
		return;
	struct sock_key k = {};
	key_of(&k, e, role, client);
	if (bpf_sock_hash_update(skops, &mw_socks, &k, BPF_NOEXIST) != 0)
		return;
	track(skops, sk, st, &k, proxy);
	key_of(&st->peer, e, role - 1, client);
	count(C_PAIRS, 1);
	if (role == ROLE_PEER_SERVER)
		count(C_PEER_PAIRS, 1);
}

// peer_server_established pairs a socket a meshed pod accepted from
// another pod's sidecar on this node (e: the client's endpoint), when the
// client filed the same two initial sequence numbers this socket saw.
static __always_inline void peer_server_established(struct bpf_sock_ops *skops, struct bpf_sock *sk, struct endpoint *e, __u32 proxy)
{
	if (is_loopback(e) || !peers_allowed(e->netns))
		return;
	e->netns = 0;
	struct endpoint_use *u = bpf_map_lookup_elem(&mw_endpoints, e);
	if (!u || u->sockets != 1)
		return;
	__u64 client = u->client;
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(sk);
	if (!tp)
		return;
	// Nothing sent or received yet but the handshake: rcv_nxt is the
	// client's ISN + 1, snd_una this socket's.
	if (skops->rcv_nxt - (__u32)tp->bytes_received != u->client_isn ||
	    skops->snd_una - (__u32)tp->bytes_acked != u->server_isn)
		return;
	track_server(skops, sk, e, ROLE_PEER_SERVER, client, proxy);
}

static __always_inline void server_established(struct bpf_sock_ops *skops)
{
	struct endpoint e = {};
	remote_endpoint(skops, &e);
	struct bpf_sock *sk = skops->sk;
	if (!sk)
		return;
	__u32 proxy = owned_by_proxy(sk);
	if (!proxy && match_gid && skops->local_port == outbound_port) {
		// Accepted on the outbound port of a namespace whose listener
		// there is the proxy's (seeded at attach or seen listening):
		// the proxy's, though it has no file to show its gid yet.
		__u64 ns = bpf_get_netns_cookie(skops);
		proxy = bpf_map_lookup_elem(&mw_sidecars, &ns) != 0;
	}
	if (skops->local_port == outbound_port && proxy) {
		mark_sidecar(skops); // the sidecar accepted an app's connection
	} else if (!is_passthrough(&e)) {
		peer_server_established(skops, sk, &e, proxy);
		return;
	} else if (proxy) {
		return; // else only the app accepting its sidecar's
	}

	struct endpoint_use *u = bpf_map_lookup_elem(&mw_endpoints, &e);
	if (!u)
		return;
	__u64 client = u->client;
	if (u->sockets != 1)
		return; // two clients share the endpoint: which one is ours?
	track_server(skops, sk, &e, ROLE_SERVER, client, proxy);
}

SEC("sockops")
int mw_sockops(struct bpf_sock_ops *skops)
{
	if (skops->op == BPF_SOCK_OPS_STATE_CB) {
		if (skops->args[1] == BPF_TCP_CLOSE)
			closed(skops);
		return 1;
	}
	if (draining())
		return 1;
	switch (skops->op) {
	case BPF_SOCK_OPS_TCP_LISTEN_CB:
		// Only the proxy's own listener makes a namespace a sidecar's.
		if (skops->local_port == outbound_port) {
			struct bpf_sock *sk = skops->sk;
			if (sk && owned_by_proxy(sk))
				mark_sidecar(skops);
		}
		break;
	case BPF_SOCK_OPS_RWND_INIT:
		// A request socket: a SYN is being answered.
		if (!skops->is_fullsock)
			peer_syn(skops);
		break;
	case BPF_SOCK_OPS_ACTIVE_ESTABLISHED_CB:
		client_established(skops);
		break;
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		server_established(skops);
		break;
	}
	return 1;
}

// feeds_proxy reports whether the proxy of the pod in network namespace
// netns may be fed: into_proxy for every pod, or the pod's own policy.
static __always_inline int feeds_proxy(__u64 netns)
{
	if (into_proxy)
		return 1;
	struct pod_policy *p = bpf_map_lookup_elem(&mw_pods, &netns);
	return p && (p->flags & POD_INTO_PROXY);
}

// ready reports whether a direction still on TCP may switch to the fast
// path: the receiver is one the fast path may feed, and it had read every
// byte this socket ever sent on TCP when it last sent (or was established),
// and this socket has written nothing since. Then no byte of this direction
// is in flight or unread, and no later byte can overtake an earlier one.
//
// The sequence numbers say it modulo 2^32 only: a receiver that stayed
// silent while 2^32 bytes went by would look up to date. The 64-bit counts
// tell such a receiver apart: the sender's bytes written (acknowledged,
// plus in flight and unsent) and the receiver's bytes read differ by a
// multiple of 2^32 when the sequence numbers match, and by no more than
// the handshake's SYN otherwise.
static __always_inline int ready(struct bpf_sock *me, const struct sock_key *peer)
{
	struct reader *r = bpf_map_lookup_elem(&mw_readers, peer);
	if (!r)
		return 0;
	if (r->proxy && !feeds_proxy(r->netns)) {
		count(C_KEPT_FOR_PROXY, 1);
		return 0;
	}
	struct tcp_sock *tx = bpf_skc_to_tcp_sock(me);
	if (!tx || tx->write_seq != r->copied)
		return 0;
	__u64 written = tx->bytes_acked + (__u32)(tx->write_seq - tx->snd_una);
	__s64 apart = (__s64)(written - r->read);
	return apart > -(1LL << 31) && apart < (1LL << 31);
}

// record publishes how far this socket has read, for its peer's ready().
static __always_inline void record(struct bpf_sock *me, struct sock_state *st)
{
	struct reader *r = bpf_map_lookup_elem(&mw_readers, &st->self);
	struct tcp_sock *tp = bpf_skc_to_tcp_sock(me);
	if (r && tp) {
		r->copied = tp->copied_seq;
		r->read = tp->bytes_received - (__u32)(tp->rcv_nxt - tp->copied_seq);
	}
}

SEC("sk_msg")
int mw_msg(struct sk_msg_md *msg)
{
	struct bpf_sock *me = msg->sk;
	if (!me)
		return SK_PASS;
	struct sock_state *st = bpf_sk_storage_get(&mw_state, me, 0, 0);
	if (!st)
		return SK_PASS;
	record(me, st);
	if (draining())
		return SK_PASS;
	struct sock_key peer = st->peer;
	if (!(st->flags & F_FAST)) {
		if (!ready(me, &peer)) {
			count(C_FALLBACKS, 1);
			return SK_PASS;
		}
		__sync_fetch_and_or(&st->flags, F_FAST);
	}
	__u32 size = msg->size;
	if (bpf_msg_redirect_hash(msg, &mw_socks, &peer, BPF_F_INGRESS) != SK_PASS)
		return SK_PASS; // the peer has left the map (closed): TCP tells the sender
	count(C_MESSAGES, 1);
	count(C_BYTES, size);
	return SK_PASS;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
