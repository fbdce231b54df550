// SPDX-License-Identifier: (MIT OR GPL-2.0)
//
// The kernel types meshwire's programs read a socket's owner through, as
// iptables' owner match sees it (sk_uid, and the fsgid of the socket's
// file): only those fields; CO-RE relocates their offsets against the
// running kernel's BTF. Shared by fastpath.c and capture.c.
#ifndef MESHWIRE_SOCK_OWNER_H
#define MESHWIRE_SOCK_OWNER_H

typedef struct { __u32 val; } kuid_t;
typedef struct { __u32 val; } kgid_t;
struct cred {
	kgid_t fsgid;
} __attribute__((preserve_access_index));
struct file {
	const struct cred *f_cred;
} __attribute__((preserve_access_index));
struct socket {
	struct file *file;
} __attribute__((preserve_access_index));
struct sock {
	kuid_t sk_uid;
	struct socket *sk_socket;
} __attribute__((preserve_access_index));

#endif
