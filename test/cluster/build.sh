#!/bin/bash
# build.sh [e2e|reference|flannel|containerd2|critest]: build the cluster's binaries and images, once
# per pinned version set, into a cache outside the repository, and print
# that cache directory. A second run with the same pins prints it at once.
#
#   bin/     kube-apiserver kube-controller-manager kube-scheduler kubelet
#            kube-proxy kubectl agnhost etcd pause (this module, one `go
#            build`), coredns (./coredns, a module of its own), e2e.test
#            (only with the e2e argument: the largest build)
#   reference/  the reference CNI plugins v1.9.1 (only with the reference
#            argument), the control of the conformance suites
#   flannel/ flanneld v0.27.4 (flanneld) and flannel's CNI plugin from
#            github.com/containernetworking/plugins v0.9.1 (cni/flannel),
#            only with the flannel argument: the multi-node cluster's pod
#            network
#   containerd2/  containerd v2.4.2 (containerd, containerd-shim-runc-v2,
#            ctr), only with the containerd2 argument: the cluster's other
#            runtime (MESHWIRE_CLUSTER_RUNTIME=containerd2)
#   images/  docker-archive tars of pause, agnhost, busybox, coredns, named
#            as the e2e suite and kubelet ask for them (images.sh; a link
#            to images-KEY, whose key adds images.sh and the Debian
#            packages it copies)
#
# build.sh istio, build.sh helm and build.sh fortio add what the comparisons with Istio's
# own programs run (peers.sh), each in a directory keyed by its pin, its
# build command, the Go version (and, for images, peers.sh, rootfs.sh and
# the Debian packages they copy), reached through a link of its name:
#   istio-bin/    istio-cni, install-cni and pilot-agent from istio.io/istio
#                 at ISTIO_VERSION (istio build)
#   helm/         helm, which renders istio-cni's chart of that module
#                 (peers.sh render) and installs meshwire's (cluster.sh's
#                 INSTALL=helm) (istio or helm build)
#   istio-images/ localhost/istio/install-cni:meshwire-test and
#                 localhost/istio/proxyv2:meshwire-test (istio build)
#   fortio-bin/, fortio-images/  fortio and localhost/fortio:meshwire-test
#                 (fortio build)
# The images directories have an index as images/ has, for the cluster's
# import.
#
# build.sh critest builds only cri-tools' critest (./critest, a module of
# its own), the images its specs run (images.sh critest) and the reference
# CNI plugins (reference/, the control), into a cache directory of their
# own, critest-VERSION-KEY, and prints it.
#
# The binaries' cache key is the hash of what decides them: both modules'
# go.mod/go.sum, the mains of this directory, the Go version, and the
# build commands of this script (between BINARIES and END BINARIES, less
# the critest part).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
export PATH=/usr/local/go/bin:$PATH CGO_ENABLED=0 GOFLAGS=-buildvcs=false

# The pins (go.mod holds them; these name the version strings and images).
K8S_VERSION=v1.34.3
ETCD_VERSION=v3.6.4    # go.etcd.io/etcd/server/v3, as k8s.io/kubernetes requires it
COREDNS_VERSION=v1.12.1 # coredns/go.mod
CRI_TOOLS_VERSION=v1.37.0 # critest/go.mod
REFERENCE_PLUGINS=v1.9.1   # github.com/containernetworking/plugins: the control of conformance and critest
FLANNEL_VERSION=v0.27.4    # github.com/flannel-io/flannel (v0.28 needs a tencentcloud-sdk-go the proxy does not serve)
FLANNEL_CNI_VERSION=v0.9.1 # the last github.com/containernetworking/plugins with plugins/meta/flannel
CONTAINERD2_VERSION=v2.4.2 # github.com/containerd/containerd/v2: the runtime that calls CNI STATUS

CACHE_ROOT=${MESHWIRE_CLUSTER_CACHE:-/var/cache/meshwire-cluster}

key=$( { cat go.mod go.sum coredns/go.mod coredns/go.sum coredns/main.go;
	find cmd -name '*.go' -print0 | sort -z | xargs -0 cat; go version;
	sed -n '/^# BINARIES/,/^# END BINARIES/p' build.sh | sed '/^# CRITEST/,/^# END CRITEST/d'; } | sha256sum | cut -c1-16)
dir=$CACHE_ROOT/k8s-$K8S_VERSION-$key
bin=$dir/bin
# The images have a key of their own (the binaries', images.sh, the Debian
# packages they copy): $dir/images links to the current ones.
ikey=$( { echo "$key"; cat images.sh lib/image.sh; dpkg-query -W busybox-static curl wget netcat-openbsd bind9-dnsutils iproute2 bash libc-bin conntrack 2>&1 || :; } | sha256sum | cut -c1-16)
images=$dir/images-$ikey

log() { printf '%s build.sh: %s\n' "$(date -u +%T)" "$*" >&2; }

# BINARIES: what decides the binaries, part of their cache key.
# Version strings: what `kubectl version` and the node's kubeletVersion say.
minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
done

step() { # step NAME CMD...: run CMD once per cache directory, timed.
	local name=$1; shift
	[ -f "$dir/.done-$name" ] && return 0
	log "building $name (log: $dir/$name.log)"
	local t0=$SECONDS
	if ! "$@" >"$dir/$name.log" 2>&1; then
		tail -30 "$dir/$name.log" >&2
		log "$name failed"
		exit 1
	fi
	echo "$((SECONDS - t0))" >"$dir/.done-$name"
	log "$name built in $((SECONDS - t0))s"
}

# CRITEST: not a part of the binaries' key (it has its own).
# reference_plugins: the reference CNI plugins into $dir/reference.
reference_plugins() {
	local ref=github.com/containernetworking/plugins/plugins
	step reference env GOBIN="$dir/reference" GOFLAGS= go install -trimpath -ldflags '-s -w' \
		$ref/main/bridge@$REFERENCE_PLUGINS $ref/main/loopback@$REFERENCE_PLUGINS $ref/ipam/host-local@$REFERENCE_PLUGINS \
		$ref/meta/portmap@$REFERENCE_PLUGINS $ref/meta/bandwidth@$REFERENCE_PLUGINS
}

if [ "${1:-}" = critest ]; then
	dir=$CACHE_ROOT/critest-$CRI_TOOLS_VERSION-$( { cat critest/go.mod critest/go.sum cmd/pause/main.go images.sh; go version; echo "$REFERENCE_PLUGINS";
		dpkg-query -W busybox-static nginx-light 2>&1 || :; } | sha256sum | cut -c1-16)
	mkdir -p "$dir/bin"
	exec 9>"$dir/.lock" && flock 9 # one build at a time (make critest runs beside another)
	step critest bash -c "go build -trimpath -ldflags '-s -w' -o '$dir/bin/' ./cmd/pause && cd critest &&
		go test -c -trimpath -ldflags '-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRI_TOOLS_VERSION' -o '$dir/bin/critest' sigs.k8s.io/cri-tools/cmd/critest"
	step images ./images.sh critest "$dir/bin" "$dir/images"
	reference_plugins
	echo "$dir"
	exit 0
fi
mkdir -p "$bin"
# END CRITEST
# One invocation, so that the packages the binaries share compile once.
step kubernetes go build -trimpath -ldflags "$ldflags" -o "$bin/" \
	k8s.io/kubernetes/cmd/kube-apiserver \
	k8s.io/kubernetes/cmd/kube-controller-manager \
	k8s.io/kubernetes/cmd/kube-scheduler \
	k8s.io/kubernetes/cmd/kubelet \
	k8s.io/kubernetes/cmd/kube-proxy \
	k8s.io/kubernetes/cmd/kubectl \
	k8s.io/kubernetes/test/images/agnhost \
	./cmd/etcd ./cmd/pause

step coredns bash -c "cd coredns && go build -trimpath -ldflags '-s -w -X github.com/coredns/coredns/coremain.GitCommit=$COREDNS_VERSION' -o '$bin/coredns' ."

# END BINARIES

# The program of Conntrack's invalid-state spec's image, from the same
# module (its version is go.mod's, in the key).
step regression-issue-74839 go build -trimpath -ldflags "-s -w" -o "$bin/" k8s.io/kubernetes/test/images/regression-issue-74839
agnhost_src=$(go list -f '{{.Dir}}' k8s.io/kubernetes/test/images/agnhost)
step "images-$ikey" ./images.sh "$bin" "$images" "$K8S_VERSION" "$COREDNS_VERSION" "$agnhost_src"
ln -sfn "images-$ikey" "$dir/images"
for old in "$dir"/images-*; do # earlier images of these binaries
	case $old in "$images" | "$images.log") ;; *) rm -rf "$old" "$dir/.done-${old##*/}" ;; esac
done

# The control network of the conformance suites.
[ "${1:-}" != reference ] || reference_plugins

# The multi-node cluster's pod network. flanneld needs cgo (its udp
# backend); the CNI plugin is named flannel too, hence two directories.
if [ "${1:-}" = flannel ]; then
	step flannel bash -c "GOBIN='$dir/flannel/bin' GOFLAGS= CGO_ENABLED=1 go install -trimpath \
		-ldflags '-s -w -X github.com/flannel-io/flannel/pkg/version.Version=$FLANNEL_VERSION' github.com/flannel-io/flannel@$FLANNEL_VERSION &&
		mv '$dir/flannel/bin/flannel' '$dir/flannel/flanneld' && rmdir '$dir/flannel/bin' &&
		GOBIN='$dir/flannel/cni' GOFLAGS= go install -trimpath -ldflags '-s -w' github.com/containernetworking/plugins/plugins/meta/flannel@$FLANNEL_CNI_VERSION"
fi

# containerd 2 (without cgo: no btrfs snapshotter, which the cluster does
# not use); the version stamped as its release's.
if [ "${1:-}" = containerd2 ]; then
	c2=github.com/containerd/containerd/v2
	step containerd2 env GOBIN="$dir/containerd2" GOFLAGS= go install -trimpath \
		-ldflags "-s -w -X $c2/version.Version=$CONTAINERD2_VERSION" \
		$c2/cmd/containerd@$CONTAINERD2_VERSION $c2/cmd/containerd-shim-runc-v2@$CONTAINERD2_VERSION $c2/cmd/ctr@$CONTAINERD2_VERSION
fi

if [ "${1:-}" = e2e ]; then
	step e2e go test -c -trimpath -ldflags "$ldflags" -o "$bin/e2e.test" k8s.io/kubernetes/test/e2e
fi

# ISTIO: Istio's own programs beside meshwire (see the header), and fortio.
ISTIO_VERSION=v0.0.0-20260827124520-eed52ebb66ad # istio.io/istio: only master pseudo-versions are served (tags are refused); test/istio's goldens come from this one
HELM_VERSION=v3.19.0   # helm.sh/helm/v3 (pairs with client-go v0.34)
FORTIO_VERSION=v1.67.1 # fortio.org/fortio (v1.68 and newer import grol.io/grol, which the proxy does not serve)

# keyed NAME EXTRA CMD...: run CMD once per key into $dir/NAME-KEY (CMD
# names that directory @OUT@), the key being the hash of EXTRA, CMD and the
# Go version; $dir/NAME links to it, and the other keys' are removed.
keyed() {
	local name=$1 extra=$2 key old; shift 2
	key=$( { printf '%s\n' "$extra" "$*"; go version; } | sha256sum | cut -c1-16)
	mkdir -p "$dir/$name-$key"
	step "$name-$key" "${@//@OUT@/$dir/$name-$key}"
	ln -sfn "$name-$key" "$dir/$name"
	for old in "$dir/$name"-*; do
		case $old in "$dir/$name-$key" | "$dir/$name-$key.log") ;; *) rm -rf "$old" "$dir/.done-${old##*/}" ;; esac
	done
}
# The images' key: the binaries' (their link's target), the scripts that
# make the root file systems (peers.sh's images part), the Debian packages
# they copy.
images_key() {
	readlink "$dir/$1"
	sed -n '/^# IMAGES/,/^# END IMAGES/p' peers.sh
	cat lib/image.sh
	cat ../../conf/kubernetes/rootfs.sh
	dpkg-query -W iptables nftables busybox-static libc6 2>&1 || :
}

# helm: istio's chart's renderer, and meshwire's own chart's installer
# (cluster.sh's INSTALL=helm).
if [ "${1:-}" = istio ] || [ "${1:-}" = helm ]; then
	keyed helm "" env GOBIN=@OUT@ GOFLAGS= nice -n 10 go install -trimpath \
		-ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" helm.sh/helm/v3/cmd/helm@$HELM_VERSION
fi

if [ "${1:-}" = istio ]; then
	ib=istio.io/istio
	keyed istio-bin "" env GOBIN=@OUT@ GOFLAGS= nice -n 10 go install -trimpath \
		-ldflags "-s -w -X $ib/pkg/version.buildVersion=$ISTIO_VERSION -X $ib/pkg/version.buildGitRevision=${ISTIO_VERSION##*-} -X $ib/pkg/version.buildStatus=Clean" \
		$ib/cni/cmd/istio-cni@$ISTIO_VERSION $ib/cni/cmd/install-cni@$ISTIO_VERSION $ib/pilot/cmd/pilot-agent@$ISTIO_VERSION
	keyed istio-images "$(images_key istio-bin)" ./peers.sh images istio "$dir/istio-bin" @OUT@
fi

if [ "${1:-}" = fortio ]; then
	keyed fortio-bin "" env GOBIN=@OUT@ GOFLAGS= nice -n 10 go install -trimpath -ldflags "-s -w" fortio.org/fortio@$FORTIO_VERSION
	keyed fortio-images "$(images_key fortio-bin)" ./peers.sh images fortio "$dir/fortio-bin" @OUT@
fi
# END ISTIO

echo "$dir"
