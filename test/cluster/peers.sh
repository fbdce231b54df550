#!/bin/bash
# peers.sh: what the comparisons of meshwire with Istio's own programs run
# on the cluster, made without a registry as images.sh makes the cluster's
# images.
#
#   peers.sh images istio BIN OUT
#       OUT/install-cni.tar  localhost/istio/install-cni:meshwire-test, laid
#           out as Istio's cni/deployments/kubernetes/Dockerfile.install-cni
#           lays it out: /usr/local/bin/install-cni, /opt/cni/bin/istio-cni
#           (the installer copies it to the node), WORKDIR /opt/cni/bin,
#           PATH ending in /opt/cni/bin; on the root file system of
#           meshwire's image (conf/kubernetes/rootfs.sh: iptables nft and
#           legacy with their extensions, nft, busybox, the istio-proxy
#           user), which stands for Istio's base image's iptables
#       OUT/proxyv2.tar  localhost/istio/proxyv2:meshwire-test, as
#           pilot/docker/Dockerfile.proxyv2 without Envoy:
#           /usr/local/bin/pilot-agent as the entrypoint, so that the
#           injector's istio-init (args: istio-iptables ...) runs as Istio
#           runs it
#   peers.sh images fortio BIN OUT
#       OUT/fortio.tar  localhost/fortio:meshwire-test: /usr/bin/fortio as
#           the entrypoint, `server` by default, as fortio's own image
#   peers.sh render sidecar|ambient CNI_BIN_DIR CNI_CONF_DIR
#       istio-cni's DaemonSet, rendered by helm (build.sh istio) from
#       manifests/charts/istio-cni of the pinned istio.io/istio module with
#       the values of manifests/istio-cni/values.yaml, to stdout, after a
#       Namespace istio-system; checked: every image is one of OUT's
#       images above (peers.sh check)
#   peers.sh check FILE
#       the rendered manifest FILE is YAML whose every document has a kind
#       and a name, and names only localhost/istio/ images
#
# BIN holds the binaries (build.sh's istio-bin/ or fortio-bin/). Each
# image directory gets an index ("NAME FILE" a line) for the cluster's
# import, as images.sh writes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export PATH=/usr/local/go/bin:/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin

# The image names the rendered manifests and the suites ask for.
ISTIO_HUB=localhost/istio
ISTIO_TAG=meshwire-test
FORTIO_IMAGE=localhost/fortio:meshwire-test

# ------------------------------------------------------------------ images

podman_store() {
	command podman --root "$work/store/root" --runroot "$work/store/run" \
		--tmpdir "$work/store/tmp" --storage-driver vfs --events-backend none \
		--cgroup-manager cgroupfs "$@"
}

# image NAME FILE DIR CHANGE...: import DIR as NAME, save it as OUT/FILE.tar.
image() {
	local name=$1 file=$2 d=$3; shift 3
	local changes=() c
	for c in "$@"; do changes+=(--change "$c"); done
	tar -C "$d" --numeric-owner --owner=0 --group=0 -cf "$work/$file-rootfs.tar" .
	podman_store import --quiet "${changes[@]}" "$work/$file-rootfs.tar" "$name" >/dev/null
	rm -f "$out/$file.tar"
	podman_store save --quiet --format docker-archive -o "$out/$file.tar" "$name"
	echo "$name $file.tar" >>"$out/index.new"
}

# iptables_rootfs DIR BIN...: meshwire's image's root file system (the
# iptables and nftables tools, busybox, the istio-proxy user) with BIN in
# /usr/local/bin instead of meshwire's binaries.
iptables_rootfs() {
	local d=$1; shift
	mkdir -p "$work/bin-${d##*/}"
	cp "$@" "$work/bin-${d##*/}/"
	"$repo/conf/kubernetes/rootfs.sh" "$work/bin-${d##*/}" "$d"
}

images() {
	local set=$1 bin=$2
	out=$3
	work=$(mktemp -d /tmp/mwk-peers.XXXXXX)
	trap 'rm -rf "$work"' EXIT
	mkdir -p "$out"
	rm -f "$out/index.new"
	case $set in
	istio)
		iptables_rootfs "$work/install-cni" "$bin/install-cni"
		install -D -m 0755 "$bin/istio-cni" "$work/install-cni/opt/cni/bin/istio-cni"
		image "$ISTIO_HUB/install-cni:$ISTIO_TAG" install-cni "$work/install-cni" \
			'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/opt/cni/bin' \
			'WORKDIR /opt/cni/bin' 'CMD ["/usr/local/bin/install-cni"]'
		iptables_rootfs "$work/proxyv2" "$bin/pilot-agent"
		image "$ISTIO_HUB/proxyv2:$ISTIO_TAG" proxyv2 "$work/proxyv2" \
			'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
			'WORKDIR /' 'ENTRYPOINT ["/usr/local/bin/pilot-agent"]'
		;;
	fortio)
		mkdir -p "$work/fortio/usr/bin" "$work/fortio/tmp" "$work/fortio/etc"
		chmod 1777 "$work/fortio/tmp"
		install -m 0755 "$bin/fortio" "$work/fortio/usr/bin/fortio"
		printf 'root:x:0:0:root:/:/usr/bin/fortio\nnobody:x:65534:65534:nobody:/:/usr/bin/fortio\n' >"$work/fortio/etc/passwd"
		image "$FORTIO_IMAGE" fortio "$work/fortio" \
			'ENTRYPOINT ["/usr/bin/fortio"]' 'CMD ["server"]' 'EXPOSE 8078 8079 8080'
		;;
	*) echo "peers.sh images: istio or fortio, not '$set'" >&2; exit 2 ;;
	esac
	mv "$out/index.new" "$out/index"
}

# ------------------------------------------------------------------ render

main() {
	case ${1:-} in
	images) shift; images "$@" ;;
	*) echo "usage: $0 images istio|fortio BIN OUT | render sidecar|ambient CNI_BIN_DIR CNI_CONF_DIR | check FILE" >&2; exit 2 ;;
	esac
}

main "$@"
