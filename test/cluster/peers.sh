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
#       istio-cni's DaemonSet and what it needs (ConfigMap, RBAC), as
#       `helm template istio-cni -n istio-system` renders them (helm v3.19.0,
#       build.sh istio; $HELM when set) from manifests/charts/istio-cni of
#       the pinned istio.io/istio module (build.sh's ISTIO_VERSION, found
#       with `go mod download -json`) with manifests/istio-cni/values.yaml
#       (chained, images above) and the node's CNI_BIN_DIR and
#       CNI_CONF_DIR; ambient adds the chart's ambient profile. With
#       $ISTIO_HOST_PROC, the DaemonSet's volume cni-host-procfs (the
#       host's /proc, fixed in the chart) is that directory instead
#       (lib/istio.sh: istio_host_proc). To stdout, after a Namespace
#       istio-system
#   peers.sh check FILE
#       the rendered manifest FILE (- for stdin) has a kind and a name in
#       every document, one DaemonSet, and names only localhost/istio/
#       images; FILE is printed when it passes, so that
#       `render ... | check - | kubectl apply -f -` applies only a checked
#       manifest
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
# IMAGES: what decides the images (build.sh keys them on this part).

# shellcheck source=lib/image.sh
. "$here/lib/image.sh"

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
			'ENTRYPOINT ["/usr/bin/fortio"]' 'CMD ["server"]' 'EXPOSE 8078' 'EXPOSE 8079' 'EXPOSE 8080'
		;;
	*) echo "peers.sh images: istio or fortio, not '$set'" >&2; exit 2 ;;
	esac
	mv "$out/index.new" "$out/index"
}

# END IMAGES
# ------------------------------------------------------------------ render

# The pinned istio.io/istio, build.sh's (one pin for the binaries, the
# images and the chart).
istio_version() { sed -n 's/^ISTIO_VERSION=\([^ ]*\).*/\1/p' "$here/build.sh"; }

# istio_module: the directory of the pinned istio.io/istio in the Go module
# cache (downloaded from the module proxy when it is not there yet), asked
# outside any module so that no go.mod or go.sum changes.
istio_module() {
	local v d
	v=$(istio_version)
	[ -n "$v" ] || { echo "peers.sh: no ISTIO_VERSION in build.sh" >&2; exit 1; }
	d=$(cd / && GOFLAGS= go mod download -json "istio.io/istio@$v" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
	[ -d "$d/manifests/charts/istio-cni" ] || { echo "peers.sh: istio.io/istio@$v has no manifests/charts/istio-cni (dir '$d')" >&2; exit 1; }
	echo "$d"
}

# render sidecar|ambient CNI_BIN_DIR CNI_CONF_DIR: see the header. helm is
# $HELM, or build.sh istio's.
render() {
	local mode=${1:-} bin=${2:-} conf=${3:-} helm=${HELM:-} extra=()
	case $mode in
	sidecar) ;;
	ambient) extra=(--set profile=ambient) ;;
	*) echo "peers.sh render: sidecar or ambient, not '$mode'" >&2; exit 2 ;;
	esac
	[ -n "$bin" ] && [ -n "$conf" ] || { echo "peers.sh render: CNI_BIN_DIR and CNI_CONF_DIR, the node's" >&2; exit 2; }
	[ -n "$helm" ] || helm=$("$here/build.sh" istio)/helm/helm
	local chart
	chart=$(istio_module)/manifests/charts/istio-cni
	local out
	out=$("$helm" template istio-cni "$chart" --namespace istio-system \
		--values "$here/manifests/istio-cni/values.yaml" \
		--set-string cniBinDir="$bin" --set-string cniConfDir="$conf" "${extra[@]}")
	if [ -n "${ISTIO_HOST_PROC:-}" ]; then
		out=$(awk -v proc="$ISTIO_HOST_PROC" '
			/^ *- name: cni-host-procfs$/ { vol = 1 }
			vol && /^ *path: \/proc$/ { sub(/\/proc$/, proc); vol = 0; n++ }
			{ print }
			END { exit n != 1 }' <<<"$out") || { echo "peers.sh render: no volume cni-host-procfs with path /proc in the chart's DaemonSet" >&2; exit 1; }
	fi
	printf 'apiVersion: v1\nkind: Namespace\nmetadata:\n  name: istio-system\n'
	printf '%s\n' "$out"
}

# ------------------------------------------------------------------ check

# check FILE (- for stdin): see the header; prints FILE when it passes, so
# that `render ... | check - | kubectl apply -f -` applies only a checked
# manifest.
check() {
	local f=${1:-}
	[ -n "$f" ] || { echo "peers.sh check: FILE" >&2; exit 2; }
	local text
	text=$(cat -- "$f")
	awk -v hub="$ISTIO_HUB/" '
	function doc_end() {
		if (lines > 0) {
			docs++
			if (kind == "") { printf "document %d: no kind\n", docs; bad++ }
			if (name == "") { printf "document %d (%s): no metadata.name\n", docs, kind; bad++ }
			if (kind == "DaemonSet") daemonsets++
		}
		lines = 0; kind = ""; name = ""; meta = 0
	}
	/^---/ { doc_end(); next }
	/^[ \t]*(#.*)?$/ { next }
	{ lines++ }
	/^kind:/ { kind = $2 }
	/^metadata:/ { meta = 1; next }
	/^[^ ]/ { meta = 0 }
	meta && /^  name:/ { name = $2 }
	/^[ \t-]*image:/ {
		img = $0; sub(/^[ \t-]*image:[ \t]*/, "", img); gsub(/["\047]/, "", img)
		if (index(img, hub) != 1) { printf "image %s is not one of %s*\n", img, hub; bad++ }
		images++
	}
	END {
		doc_end()
		if (daemonsets != 1) { printf "%d DaemonSets, want istio-cni-node alone\n", daemonsets; bad++ }
		if (images == 0) { print "no image"; bad++ }
		exit bad > 0
	}' <<<"$text" >&2 || { echo "peers.sh check: $f fails (above)" >&2; exit 1; }
	printf '%s\n' "$text"
}

main() {
	case ${1:-} in
	images) shift; images "$@" ;;
	render) shift; render "$@" ;;
	check) shift; check "$@" ;;
	*) echo "usage: $0 images istio|fortio BIN OUT | render sidecar|ambient CNI_BIN_DIR CNI_CONF_DIR | check FILE" >&2; exit 2 ;;
	esac
}

main "$@"
