#!/bin/bash
# images.sh BIN OUT K8S_VERSION COREDNS_VERSION: the cluster's images, made
# without a registry: a root file system per image as a tar, `podman
# import` into a podman store of its own (vfs, removed afterwards), `podman
# save --format docker-archive` into OUT/NAME.tar, which `ctr images import`
# reads. The names are those the e2e suite (test/utils/image/manifest.go of
# the pinned Kubernetes) and kubelet ask for, so nothing is ever pulled.
set -euo pipefail
bin=$1 out=$2 coredns_version=$4
busybox=/bin/busybox # Debian's busybox-static

work=$(mktemp -d /tmp/mwk-images.XXXXXX)
trap 'rm -rf "$work"' EXIT
podman() {
	command podman --root "$work/store/root" --runroot "$work/store/run" \
		--tmpdir "$work/store/tmp" --storage-driver vfs --events-backend none \
		--cgroup-manager cgroupfs "$@"
}

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

# image NAME FILE DIR CHANGE...: import DIR as NAME, save it as OUT/FILE.tar.
image() {
	local name=$1 file=$2 d=$3; shift 3
	local changes=()
	for c in "$@"; do changes+=(--change "$c"); done
	tar -C "$d" --numeric-owner --owner=0 --group=0 -cf "$work/$file-rootfs.tar" .
	podman import --quiet "${changes[@]}" "$work/$file-rootfs.tar" "$name" >/dev/null
	rm -f "$out/$file.tar"
	podman save --quiet --format docker-archive -o "$out/$file.tar" "$name"
	echo "$name $file.tar" >>"$out/index.new"
}

mkdir -p "$out"
rm -f "$out/index.new"

rootfs "$work/pause"
cp "$bin/pause" "$work/pause/pause"
image registry.k8s.io/pause:3.10.1 pause "$work/pause" 'ENTRYPOINT ["/pause"]' 'USER 65535:65535'

rootfs "$work/busybox" busybox
image registry.k8s.io/e2e-test-images/busybox:1.37.0-1 busybox "$work/busybox" 'CMD ["sh"]' 'ENV PATH=/bin'

rootfs "$work/agnhost" busybox
cp "$bin/agnhost" "$work/agnhost/agnhost"
image registry.k8s.io/e2e-test-images/agnhost:2.56 agnhost "$work/agnhost" \
	'ENTRYPOINT ["/agnhost"]' 'CMD ["pause"]' 'ENV PATH=/bin'

rootfs "$work/coredns"
cp "$bin/coredns" "$work/coredns/coredns"
image "registry.k8s.io/coredns/coredns:$coredns_version" coredns "$work/coredns" 'ENTRYPOINT ["/coredns"]'

mv "$out/index.new" "$out/index"
