#!/bin/bash
# images.sh BIN OUT K8S_VERSION COREDNS_VERSION AGNHOST_SRC: the cluster's images, made
# without a registry: a root file system per image as a tar, `podman
# import` into a podman store of its own (vfs, removed afterwards), `podman
# save --format docker-archive` into OUT/NAME.tar, which `ctr images import`
# reads. The names are those the e2e suite (test/utils/image/manifest.go of
# the pinned Kubernetes) and kubelet ask for, so nothing is ever pulled.
#
# images.sh critest BIN OUT: the images critest's specs ask for (cri-tools'
# pkg/framework and pkg/validate constants) and the pause image, made the
# same way.
set -euo pipefail
if [ "$1" = critest ]; then set_name=critest bin=$2 out=$3; else set_name=cluster bin=$1 out=$2 coredns_version=$4 agnhost_src=$5; fi
busybox=/bin/busybox # Debian's busybox-static
# What agnhost's own image (Alpine) adds and the e2e suite runs in it:
# Debian's builds, copied with the shared libraries they load.
# wget: the suite runs `wget -T 1`, on which Debian's static busybox wget
# crashes (SIGSEGV).
AGNHOST_TOOLS="/usr/bin/curl /usr/bin/wget /usr/bin/nc /usr/bin/dig /usr/sbin/ip /usr/bin/bash /usr/bin/getent"

work=$(mktemp -d /tmp/mwk-images.XXXXXX)
trap 'rm -rf "$work"' EXIT
# shellcheck source=lib/image.sh
. "$(dirname "$0")/lib/image.sh"

# rootfs DIR [busybox]: an empty root file system, or busybox with a link
# per applet, /etc/passwd and /etc/group (root, nobody) and a sticky /tmp.
rootfs() {
	local d=$1
	mkdir -p "$d"/{dev,etc,proc,sys,tmp,var,root}
	chmod 1777 "$d/tmp"
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$d/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$d/etc/group"
	if [ "${2:-}" = busybox ]; then
		head -c 4096 "$busybox" | grep -qa 'ld-linux' && {
			echo "$busybox is dynamically linked: install busybox-static" >&2
			exit 1
		}
		mkdir -p "$d/bin"
		cp "$busybox" "$d/bin/busybox"
		for a in $("$busybox" --list); do
			[ "$a" = busybox ] || ln -sf busybox "$d/bin/$a"
		done
	fi
}

# with_libs ROOT BIN...: copy each BIN and the shared libraries it loads
# (ldd's paths, the dynamic loader included) to the same paths under ROOT.
with_libs() {
	local root=$1; shift
	local f lib
	for f in "$@"; do
		[ -x "$f" ] || { echo "$f is missing (apt-get install curl wget netcat-openbsd bind9-dnsutils iproute2 bash libc-bin)" >&2; exit 1; }
		cp --parents -L "$f" "$root/"
		for lib in $(ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
			[ -e "$root$lib" ] || cp --parents -L "$lib" "$root/"
		done
	done
}

# busybox_image NAME: Debian's busybox-static as the e2e suite's busybox.
busybox_image() {
	rootfs "$work/busybox" busybox
	image "$1" busybox "$work/busybox" 'CMD ["sh"]' 'ENV PATH=/bin'
}

mkdir -p "$out"
rm -f "$out/index.new"

rootfs "$work/pause"
cp "$bin/pause" "$work/pause/pause"
image registry.k8s.io/pause:3.10.1 pause "$work/pause" 'ENTRYPOINT ["/pause"]' 'USER 65535:65535'

if [ "$set_name" = critest ]; then
	# The specs' default container (it runs top, cat, hostname).
	busybox_image registry.k8s.io/e2e-test-images/busybox:1.29-2
	# The web server of the port mapping specs (GET / on port 80 must
	# answer 200): Debian's nginx (nginx-light) with its libraries, serving
	# a static page as the upstream nginx image does; with a shell and
	# tools (busybox) and its pid file where upstream's is, which the
	# security context specs read.
	n=$work/nginx
	rootfs "$n" busybox
	with_libs "$n" /usr/sbin/nginx
	mkdir -p "$n/etc/nginx" "$n/var/lib/nginx" "$n/var/log/nginx" "$n/var/run" "$n/usr/share/nginx/html"
	cat >"$n/etc/nginx/nginx.conf" <<-'EOF'
		user nobody nogroup;
		worker_processes 1;
		pid /var/run/nginx.pid;
		error_log stderr;
		events {}
		http {
		  access_log off;
		  server { listen 80; root /usr/share/nginx/html; }
		}
	EOF
	echo '<html><body>nginx (meshwire critest image)</body></html>' >"$n/usr/share/nginx/html/index.html"
	image registry.k8s.io/e2e-test-images/nginx:1.14-2 nginx "$n" \
		'CMD ["/usr/sbin/nginx", "-g", "daemon off;"]' 'STOPSIGNAL SIGQUIT' \
		'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
	mv "$out/index.new" "$out/index"
	exit 0
fi

busybox_image registry.k8s.io/e2e-test-images/busybox:1.37.0-1

# agnhost as test/images/agnhost/Dockerfile lays it out: /agnhost and its
# agnhost-2 link, porter's certificate, /uploads, the user and group the
# suite expects in the image, the tools above before busybox on PATH.
rootfs "$work/agnhost" busybox
a=$work/agnhost
with_libs "$a" $AGNHOST_TOOLS
[ -e "$a/bin/bash" ] || ln -s /usr/bin/bash "$a/bin/bash"
# Debian's static busybox runs its own applets first from its shell (ip,
# nc, ...) whatever PATH says; the suite's `sh -c` must find the tools.
ln -sf /usr/bin/bash "$a/bin/sh"
cp "$bin/agnhost" "$a/agnhost"
cp "$bin/coredns" "$a/coredns" # the DNS specs' test server (upstream: CoreDNS 1.6.2)
ln -s agnhost "$a/agnhost-2"
cp "$agnhost_src/porter/localhost.crt" "$agnhost_src/porter/localhost.key" "$a/"
mkdir -p "$a/uploads"
echo 'user-defined-in-image:x:1000:1000::/home/user-defined-in-image:/bin/sh' >>"$a/etc/passwd"
printf 'user-defined-in-image:x:1000:\ngroup-defined-in-image:x:50000:user-defined-in-image\n' >>"$a/etc/group"
image registry.k8s.io/e2e-test-images/agnhost:2.56 agnhost "$a" \
	'ENTRYPOINT ["/agnhost"]' 'CMD ["pause"]' 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'

# jessie-dnsutils, the DNS tests' prober: dig, getent and a shell.
rootfs "$work/jessie" busybox
with_libs "$work/jessie" /usr/bin/dig /usr/bin/getent /usr/bin/bash
ln -sf /usr/bin/bash "$work/jessie/bin/sh"
image registry.k8s.io/e2e-test-images/jessie-dnsutils:1.7 jessie-dnsutils "$work/jessie" \
	'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' 'CMD ["sh"]'

# distroless-iptables, where KubeProxy's CLOSE_WAIT spec reads the node's
# conntrack table from a host-network pod (`sleep 600`, then `sh -c
# "conntrack -L ... | grep ..."`): Debian's conntrack with its libraries,
# busybox for the shell, sleep and grep.
rootfs "$work/distroless-iptables" busybox
with_libs "$work/distroless-iptables" /usr/sbin/conntrack
image registry.k8s.io/build-image/distroless-iptables:v0.7.13 distroless-iptables "$work/distroless-iptables" \
	'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'

# regression-issue-74839, the server of Conntrack's invalid-state spec
# (it answers with raw sockets), as its Dockerfile lays it out.
rootfs "$work/regression"
cp "$bin/regression-issue-74839" "$work/regression/regression-issue-74839"
image registry.k8s.io/e2e-test-images/regression-issue-74839:1.2 regression-issue-74839 "$work/regression" \
	'ENTRYPOINT ["/regression-issue-74839"]'

rootfs "$work/coredns"
cp "$bin/coredns" "$work/coredns/coredns"
image "registry.k8s.io/coredns/coredns:$coredns_version" coredns "$work/coredns" 'ENTRYPOINT ["/coredns"]'

mv "$out/index.new" "$out/index"
