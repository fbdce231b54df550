#!/bin/bash
# cluster.sh up|down|env|status|smoke: a single-node Kubernetes cluster whose
# network is meshwire, from binaries built from source (build.sh), in the
# shape of Kubernetes' hack/local-up-cluster.sh: every process's flags in
# this file, certificates and kubeconfigs made on the fly, one log and one
# pid file per component under the state directory, one tear-down.
#
#   up      build (or reuse the cache), start containerd, etcd, the control
#           plane, kubelet and kube-proxy; install meshwire with its DaemonSet
#           (the node turns Ready once meshwire's installer wrote the CNI
#           config); start CoreDNS
#   smoke   a pod behind a ClusterIP Service, reached from another pod by the
#           Service's IP and by its DNS names; a pod the intercept plugin
#           intercepts (annotation) answered by its "proxy"
#   e2e     Kubernetes' e2e suite against it (default: sig-network
#           conformance)
#   mesh    Istio-annotated Deployments (REDIRECT, TPROXY, EBPF) reached
#           through a ClusterIP and a NodePort Service, with the fast path
#           the node agent attached; a new meshwire image rolled out
#           under them
#   ambient Istio ambient mode through the API server: the agent with
#           --ambient, a ztunnel stand-in (test/proxy -zds), an app running
#           since before ambient mode enrolled (from its processes) and
#           unenrolled by its namespace's label, traffic through the
#           stand-in, probes, a restarted stand-in's snapshot; ambient mode
#           off again at the end
#   podstart  N pods created at once, create-to-Ready times
#   conformance  e2e and podstart with meshwire, then again with the
#           reference plugins in the same conflist (the control)
#   env     the shell lines that point kubectl at the cluster
#   status  the components' processes, the node and the pods
#   down    drain the pods (so that the CNI plugins' DEL runs), stop every
#           process, undo what the cluster changed on the host, remove the
#           state directory
#
# No systemd: the processes are started with setsid and tracked by pid.
# No registry: every image is imported into containerd (images.sh).
#
# MESHWIRE_CLUSTER_CNI=reference starts the cluster on the reference
# plugins v1.9.1 (bridge, host-local, portmap, bandwidth, loopback) with the
# same conflist, written by this script instead of meshwire's installer.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
export PATH=/usr/local/go/bin:/usr/local/sbin:/usr/sbin:/sbin:/usr/local/bin:/usr/bin:/bin

STATE=${MESHWIRE_CLUSTER_STATE:-/var/lib/meshwire-cluster}
POD_CIDR=198.18.0.0/16     # RFC 2544 test range: host-local's range on the node
SERVICE_CIDR=198.19.0.0/16 # RFC 2544 test range
API_SERVICE_IP=198.19.0.1
DNS_SERVICE_IP=198.19.0.10
CLUSTER_DOMAIN=cluster.local
API_PORT=6443
ETCD_CLIENT=127.0.0.1:2379
ETCD_PEER=127.0.0.1:2380
NODE_NAME=${NODE_NAME:-$(hostname | tr '[:upper:]' '[:lower:]')}
# The node's IP: the IPv4 address of the default route's interface. Nothing
# routes to it or adds it anywhere; the apiserver advertises it.
node_ip() {
	local dev
	dev=$(ip -4 route show default | awk '{for (i = 1; i < NF; i++) if ($i == "dev") {print $(i+1); exit}}')
	ip -4 -o addr show dev "$dev" | awk '{split($4, a, "/"); print a[1]; exit}'
}
NODE_IP=${NODE_IP:-$(node_ip)}
BRIDGE=mwk0 NETWORK=mwk-cluster # manifests/meshwire/cluster.conflist's
# Which plugins wire the pods: meshwire (its DaemonSet installs them) or
# reference (v1.9.1, built by build.sh reference, installed by up).
CNI=${MESHWIRE_CLUSTER_CNI:-meshwire}
case $CNI in meshwire | reference) ;; *) echo "MESHWIRE_CLUSTER_CNI: meshwire or reference, not '$CNI'" >&2; exit 2 ;; esac

# The node-wide lock of meshwire's kernel tests (internal/kerneltest),
# held while the cluster runs: the tests' leak checks would see its pods
# come and go, and make test's host seed would become kube-proxy's.
TEST_LOCK=/run/meshwire-tests.lock

CONTAINERD=/usr/bin/containerd CTR=/usr/bin/ctr RUNC=/usr/sbin/runc
SANDBOX_IMAGE=registry.k8s.io/pause:3.10.1 # images.sh builds it
PKI=$STATE/pki KCFG=$STATE/kubeconfig LOGS=$STATE/logs RUN=$STATE/run
# The e2e suite's leak snapshot as a command (test/snapshot, built by make
# build): the host before up, and the node before its CNI was installed.
SNAPSHOT=$repo/bin/test/snapshot
SOCK=$STATE/containerd/containerd.sock
CNI_BIN=$STATE/cni/bin CNI_CONF=$STATE/cni/net.d
ADMIN=$KCFG/admin.kubeconfig

log() { printf '%s cluster: %s\n' "$(date -u +%T)" "$*" >&2; }
die() { log "error: $*"; exit 1; }
kc() { "$BIN/kubectl" --kubeconfig "$ADMIN" "$@"; }

# bin_dir sets BIN (and CACHE) from the build cache, building if needed.
bin_dir() {
	if [ -z "${BIN:-}" ]; then
		CACHE=$("$here/build.sh")
		BIN=$CACHE/bin
	else
		CACHE=$(dirname "$BIN")
	fi
}

# ---------------------------------------------------------------- processes

# start NAME CMD...: run CMD in a session of its own, output to
# $LOGS/NAME.log, pid in $RUN/NAME.pid.
start() {
	local name=$1; shift
	log "starting $name"
	printf '%q ' "$@" >"$RUN/$name.cmd"
	setsid "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
	echo $! >"$RUN/$name.pid"
}

alive() { [ -f "$RUN/$1.pid" ] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }

# stop NAME: SIGTERM, then SIGKILL after 20 s.
stop() {
	local name=$1 pid
	[ -f "$RUN/$name.pid" ] || return 0
	pid=$(cat "$RUN/$name.pid")
	if kill -0 "$pid" 2>/dev/null; then
		log "stopping $name (pid $pid)"
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
		kill -0 "$pid" 2>/dev/null && { log "$name still running: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; sleep 0.5; }
	fi
	rm -f "$RUN/$name.pid"
}

# wait_for WHAT SECONDS CMD...: retry CMD every second.
wait_for() {
	local what=$1 limit=$2; shift 2
	local t0=$SECONDS
	until "$@" >/dev/null 2>&1; do
		[ $((SECONDS - t0)) -lt "$limit" ] || { log "timed out after ${limit}s waiting for $what"; return 1; }
		sleep 1
	done
	log "$what after $((SECONDS - t0))s"
}

# ------------------------------------------------------------- certificates

# cert NAME CN O EKU [SAN]: a key and a certificate signed by the cluster CA.
cert() {
	local name=$1 cn=$2 o=$3 eku=$4 san=${5:-}
	local subj="/CN=$cn"
	[ -n "$o" ] && subj="/O=$o$subj"
	openssl req -new -newkey rsa:2048 -nodes -keyout "$PKI/$name.key" -subj "$subj" \
		-out "$PKI/$name.csr" 2>/dev/null
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=$eku"
		[ -n "$san" ] && echo "subjectAltName=$san"
	} >"$PKI/$name.ext"
	openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
		-CAcreateserial -days 30 -sha256 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
	rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

# kubeconfig NAME CERT: a kubeconfig authenticating with pki/CERT.{crt,key}.
kubeconfig() {
	cat >"$KCFG/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: meshwire
  cluster:
    certificate-authority: $PKI/ca.crt
    server: https://$NODE_IP:$API_PORT
users:
- name: $1
  user:
    client-certificate: $PKI/$2.crt
    client-key: $PKI/$2.key
contexts:
- name: meshwire
  context: {cluster: meshwire, user: $1}
current-context: meshwire
EOF
}

make_pki() {
	log "certificates and kubeconfigs in $PKI, $KCFG"
	openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -out "$PKI/ca.crt" \
		-days 30 -subj "/CN=meshwire-cluster-ca" 2>/dev/null
	cert apiserver kube-apiserver "" serverAuth \
		"IP:$API_SERVICE_IP,IP:$NODE_IP,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$CLUSTER_DOMAIN"
	cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters clientAuth
	cert admin admin system:masters clientAuth
	cert controller-manager system:kube-controller-manager "" clientAuth
	cert scheduler system:kube-scheduler "" clientAuth
	cert kube-proxy system:kube-proxy "" clientAuth
	cert kubelet "system:node:$NODE_NAME" system:nodes clientAuth
	cert kubelet-serving "$NODE_NAME" "" serverAuth "IP:$NODE_IP,IP:127.0.0.1,DNS:$NODE_NAME"
	openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
	openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
	kubeconfig admin admin
	kubeconfig controller-manager controller-manager
	kubeconfig scheduler scheduler
	kubeconfig kube-proxy kube-proxy
	kubeconfig kubelet kubelet
}

# ----------------------------------------------------------- host snapshot

# What the cluster may change on the host, recorded at up and put back at
# down: sysctls kubelet, kube-proxy and the bridge plugin set, and whether
# the host paths the components write to existed.
SYSCTLS="vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes
net.ipv4.ip_forward net.ipv6.conf.all.forwarding net.ipv4.conf.all.route_localnet net.netfilter.nf_conntrack_max
net.netfilter.nf_conntrack_tcp_timeout_established net.netfilter.nf_conntrack_tcp_timeout_close_wait net.bridge.bridge-nf-call-iptables"
# Host paths kubelet, containerd and the CNI plugins create outside the state
# directory: removed at down when they did not exist at up (the shared
# ones only when empty: other users of this machine may have put things
# there meanwhile).
NEW_TREES="/var/log/pods /var/log/containers /var/lib/kubelet" # kubelet: container logs, device-plugins socket
NEW_DIRS="/run/containerd/s /run/containerd /var/lib/cni/results /var/lib/cni/networks /var/lib/cni/meshwire/fastpath /var/lib/cni/meshwire/intercept /var/lib/cni/meshwire/pods /var/lib/cni/meshwire/ambient/enrolled /var/lib/cni/meshwire/ambient /var/lib/cni/meshwire /var/lib/cni /run/ztunnel"

# The pods' cgroup parents (containerd's namespace; critest asks for
# test.slice), in every hierarchy.
CGROUP_PARENTS=k8s.io
cgroup_parents() {
	local p
	for p in $CGROUP_PARENTS; do ls -d /sys/fs/cgroup/*/"$p" 2>/dev/null || :; done
}

snapshot_host() {
	local f=$STATE/host-before
	: >"$f.sysctl"
	for s in $SYSCTLS; do
		v=$(sysctl -n "$s" 2>/dev/null) && printf '%s=%s\n' "$s" "$v" >>"$f.sysctl"
	done
	: >"$f.paths"
	for p in $NEW_TREES $NEW_DIRS; do [ -e "$p" ] && echo "$p" >>"$f.paths"; done
	ip link show "$BRIDGE" >/dev/null 2>&1 && echo "$BRIDGE" >"$f.bridge" || : >"$f.bridge"
	cgroup_parents >"$f.cgroups"
	chains CNI-HOSTPORT- >"$f.chains" # the reference control's portmap
	# ambient mode's host rule and probe sets (cluster.sh ambient)
	chains ISTIO_POSTRT >"$f.istio-chains"
	probe_sets >"$f.ipsets"
	ls /run/netns 2>/dev/null >"$f.netns" || :
	# meshwire's DaemonSet mounts the host's bpffs with Bidirectional
	# propagation (the agent mounts one there on a host without), which
	# the runtime allows only on a shared mount. systemd makes every mount
	# shared; on this machine, without systemd, up does.
	: >"$f.bpffs"
	if [ "$(findmnt -n -o PROPAGATION /sys/fs/bpf 2>/dev/null)" = private ]; then
		log "making /sys/fs/bpf a shared mount (as systemd does), private again at down"
		mount --make-shared /sys/fs/bpf
		echo private >"$f.bpffs"
	fi
	# The same for its HostToContainer mount of /run/netns, where the
	# runtime keeps the pods' namespaces: a shared bind mount of its own,
	# as `ip netns add` makes it.
	mkdir -p /run/netns
	: >"$f.netns-mount"
	case $(findmnt -n -o PROPAGATION -M /run/netns 2>/dev/null) in
	shared* | *slave*) ;;
	*)
		log "making /run/netns a shared mount (as ip netns add does); removed at down when empty"
		mount --bind /run/netns /run/netns && mount --make-shared /run/netns
		echo made >"$f.netns-mount"
		;;
	esac
}

# probe_sets: the ipsets of ambient mode's host rule on the host. The
# host snapshot (test/harness) has no ipsets: down checks these itself.
probe_sets() { ipset list -n 2>/dev/null | grep -E '^istio-inpod-probes-' || true; }

# check_probe_sets: after the drain, ambient mode's probe sets are gone
# (the agent removes them, and its host rule, when it stops with no pod
# enrolled: the drain deletes the pods before meshwire's DaemonSet).
check_probe_sets() {
	local left
	left=$(probe_sets | grep -vxF -f "$STATE/host-before.ipsets" || true)
	if [ -n "$left" ]; then
		log "leak check (ambient) FAILED: probe sets left: $(echo $left)"
		LEAKS=1
	else
		log "leak check (ambient): no probe set left"
	fi
}

# ------------------------------------------------------------------- config

write_configs() {
	write_containerd_config
	write_kube_configs
}

# write_containerd_config: containerd's config (critest.sh's too), from
# the template meshwire's CRI tests render too (test/cri/containerd.toml;
# test/cri's TestClusterConfig checks that both fill it alike): the local
# pause image, the CNI config meshwire's installer writes.
write_containerd_config() {
	mkdir -p "$STATE/config"
	sed -e "s|@ROOT@|$STATE/containerd/root|g" \
		-e "s|@STATE@|$STATE/containerd/state|g" \
		-e "s|@SOCKET@|$SOCK|g" \
		-e "s|@OPT@|$STATE/containerd/opt|g" \
		-e "s|@SANDBOX_IMAGE@|$SANDBOX_IMAGE|g" \
		-e "s|@RUNC@|$RUNC|g" \
		-e "s|@RUNC_ROOT@|$STATE/containerd/runc|g" \
		-e "s|@CNI_BIN@|$CNI_BIN|g" \
		-e "s|@CNI_CONF@|$CNI_CONF|g" \
		"$repo/test/cri/containerd.toml" >"$STATE/config/containerd.toml"
}

write_kube_configs() {
	# kubelet: cgroupfs without per-QoS cgroups on this hybrid cgroup
	# layout, no swap check, no image garbage collection (there is no
	# registry to pull a collected image from again), eviction only on
	# memory and a nearly full disk.
	cat >"$STATE/config/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$SOCK
imageServiceEndpoint: unix://$SOCK
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
address: $NODE_IP
healthzBindAddress: 127.0.0.1
readOnlyPort: 0
clusterDNS: [$DNS_SERVICE_IP]
clusterDomain: $CLUSTER_DOMAIN
resolvConf: $STATE/config/resolv.conf
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
serializeImagePulls: false
EOF
	# Pods with dnsPolicy Default (CoreDNS) get this: the cluster sends no
	# DNS query off the machine.
	echo "nameserver 127.0.0.1" >"$STATE/config/resolv.conf"

	# kube-proxy, iptables mode; it leaves the host's conntrack settings
	# and route_localnet alone.
	cat >"$STATE/config/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: $KCFG/kube-proxy.kubeconfig}
hostnameOverride: $NODE_NAME
clusterCIDR: $POD_CIDR
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
iptables:
  localhostNodePorts: false
EOF
}

# ------------------------------------------------------------ the processes
# Every component's flags, in one place.

start_containerd() {
	mkdir -p "$STATE/containerd" "$CNI_BIN" "$CNI_CONF"
	# Every image is imported: a pull (an image the suite wants that
	# images.sh does not make) goes to a closed local port and fails at
	# once instead of leaving the machine (containerd honours the proxy
	# variables for registry requests, and resolves no registry name).
	start containerd env HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 NO_PROXY= \
		"$CONTAINERD" --config "$STATE/config/containerd.toml"
	wait_for containerd 30 "$CTR" -a "$SOCK" version
}

start_etcd() {
	start etcd "$BIN/etcd" --name mwk --data-dir "$STATE/etcd" \
		--listen-client-urls "http://$ETCD_CLIENT" --advertise-client-urls "http://$ETCD_CLIENT" \
		--listen-peer-urls "http://$ETCD_PEER" --initial-advertise-peer-urls "http://$ETCD_PEER" \
		--initial-cluster "mwk=http://$ETCD_PEER" --log-level warn
}

start_apiserver() {
	start kube-apiserver "$BIN/kube-apiserver" \
		--etcd-servers "http://$ETCD_CLIENT" \
		--advertise-address "$NODE_IP" --secure-port "$API_PORT" \
		--service-cluster-ip-range "$SERVICE_CIDR" \
		--client-ca-file "$PKI/ca.crt" \
		--tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
		--kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
		--kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
		--kubelet-certificate-authority "$PKI/ca.crt" \
		--kubelet-preferred-address-types InternalIP,Hostname \
		--service-account-issuer "https://kubernetes.default.svc.$CLUSTER_DOMAIN" \
		--service-account-key-file "$PKI/sa.pub" \
		--service-account-signing-key-file "$PKI/sa.key" \
		--authorization-mode Node,RBAC \
		--allow-privileged=true \
		--cert-dir "$STATE/apiserver" \
		--profiling=false
}

start_controller_manager() {
	start kube-controller-manager "$BIN/kube-controller-manager" \
		--kubeconfig "$KCFG/controller-manager.kubeconfig" \
		--authentication-kubeconfig "$KCFG/controller-manager.kubeconfig" \
		--authorization-kubeconfig "$KCFG/controller-manager.kubeconfig" \
		--bind-address 127.0.0.1 --leader-elect=false \
		--use-service-account-credentials \
		--service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
		--cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
		--service-cluster-ip-range "$SERVICE_CIDR" \
		--allocate-node-cidrs --cluster-cidr "$POD_CIDR" --node-cidr-mask-size 16 \
		--controllers '*,bootstrapsigner,tokencleaner' \
		--cert-dir "$STATE/controller-manager" \
		--profiling=false
}

start_scheduler() {
	start kube-scheduler "$BIN/kube-scheduler" \
		--kubeconfig "$KCFG/scheduler.kubeconfig" \
		--authentication-kubeconfig "$KCFG/scheduler.kubeconfig" \
		--authorization-kubeconfig "$KCFG/scheduler.kubeconfig" \
		--bind-address 127.0.0.1 --leader-elect=false --profiling=false
}

start_kubelet() {
	start kubelet "$BIN/kubelet" \
		--config "$STATE/config/kubelet.yaml" \
		--kubeconfig "$KCFG/kubelet.kubeconfig" \
		--hostname-override "$NODE_NAME" --node-ip "$NODE_IP" \
		--root-dir "$STATE/kubelet" --cert-dir "$STATE/kubelet/pki" \
		--v 1
}

start_kube_proxy() {
	start kube-proxy "$BIN/kube-proxy" --config "$STATE/config/kube-proxy.yaml"
}

# hold_test_lock: a process that holds the kernel tests' lock until down
# stops it; up waits for running kernel tests first, as they wait for
# each other (up to an hour).
hold_test_lock() {
	flock -n "$TEST_LOCK" true || log "waiting for meshwire's kernel tests (make test, bench or chaos) to release $TEST_LOCK"
	start kernel-test-lock bash -c 'exec 9>"$1" && flock -w 3600 9 && touch "$2" && exec sleep infinity' lock "$TEST_LOCK" "$RUN/kernel-test-lock.held"
	wait_for "the kernel tests' lock" 3600 test -e "$RUN/kernel-test-lock.held" || die "could not take $TEST_LOCK"
}

# The processes, in the order up starts them; down stops them in reverse.
COMPONENTS="kernel-test-lock containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy"

# guard: a packet to the service range that kube-proxy did not DNAT (an
# address no Service has, a stale DNS answer) would follow the default
# route off the machine; MWK-GUARD rejects it instead, for pods (FORWARD)
# and the host (OUTPUT).
guard() {
	iptables -N MWK-GUARD
	iptables -A MWK-GUARD -d "$SERVICE_CIDR" -m conntrack ! --ctstate DNAT \
		-m comment --comment "meshwire cluster: no Service at this address" -j REJECT
	iptables -I FORWARD 1 -j MWK-GUARD
	iptables -I OUTPUT 1 -j MWK-GUARD
}

# ---------------------------------------------------------------- images

# import_image_set DIR: the images images.sh made into DIR.
import_image_set() {
	local name file
	while read -r name file; do
		"$CTR" -a "$SOCK" -n k8s.io images import --no-unpack "$1/$file" >/dev/null
	done <"$1/index"
}

import_images() {
	local t0=$SECONDS
	import_image_set "$CACHE/images"
	if [ "$CNI" = meshwire ]; then meshwire_images; fi
	log "images imported in $((SECONDS - t0))s:"
	"$CTR" -a "$SOCK" -n k8s.io images ls -q | grep -v '^sha256:' | sed 's/^/    /' >&2
}

# ------------------------------------------------------------------ meshwire

# podman_to_containerd IMAGE...: podman's images into the cluster's containerd.
podman_to_containerd() {
	podman save --quiet --multi-image-archive --format docker-archive -o "$STATE/image.tar" "$@"
	"$CTR" -a "$SOCK" -n k8s.io images import --no-unpack "$STATE/image.tar" >/dev/null
	rm -f "$STATE/image.tar"
}

# meshwire_images: meshwire's image, built from this tree the way a user
# builds it (make image); the same image under a second tag, the "new
# version" mesh rolls out; and the test proxy (test/proxy), the sidecar of
# mesh's pods.
meshwire_images() {
	log "make image (meshwire's image, log: $LOGS/make-image.log)"
	make -C "$repo" image >"$LOGS/make-image.log" 2>&1 || { tail -20 "$LOGS/make-image.log" >&2; die "make image failed"; }
	podman tag localhost/meshwire:latest localhost/meshwire:rollout
	local root=$STATE/testproxy-root
	mkdir -p "$root"
	cp "$repo/bin/test/proxy" "$root/proxy"
	tar -C "$root" -c . | podman import --quiet - localhost/meshwire-testproxy:latest >/dev/null
	rm -rf "$root"
	podman_to_containerd localhost/meshwire:latest localhost/meshwire:rollout localhost/meshwire-testproxy:latest
}

# The DaemonSet of conf/kubernetes, unchanged, through a kustomization
# (manifests/meshwire) that points its host paths into the state directory
# and makes meshwire write the node's only CNI config itself.
install_meshwire() {
	local d=$STATE/manifests/meshwire
	mkdir -p "$d"
	cp "$repo/conf/kubernetes/daemonset.yaml" "$d/daemonset.yaml"
	cp "$here/manifests/meshwire/cluster.conflist" "$d/"
	sed -e "s#@STATE@#$STATE#g" -e "s#@POD_CIDR@#$POD_CIDR#g" \
		"$here/manifests/meshwire/kustomization.yaml" >"$d/kustomization.yaml"
	kc apply -k "$d" >&2
}

# install_reference: the control network, the reference plugins v1.9.1 with
# the same conflist, written where meshwire's installer writes its own.
install_reference() {
	local p
	"$here/build.sh" reference >/dev/null
	for p in bridge host-local portmap bandwidth loopback; do
		install -m 0755 "$CACHE/reference/$p" "$CNI_BIN/$p"
	done
	install -m 0644 "$here/manifests/meshwire/cluster.conflist" "$CNI_CONF/05-reference.conflist"
	log "reference plugins v1.9.1 and $CNI_CONF/05-reference.conflist installed"
}

kube_proxy_synced() { iptables -t nat -S KUBE-SERVICES 2>/dev/null | grep -q 'default/kubernetes:https'; }

node_ready() {
	[ "$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

# ------------------------------------------------------------------- up/down

up() {
	[ "$(id -u)" = 0 ] || die "run as root"
	for c in $COMPONENTS; do alive "$c" && die "$c is running already ($STATE); run '$0 down' first"; done
	[ -e "$STATE" ] && die "$STATE exists (a cluster that was not taken down?); run '$0 down' first"
	for p in ${ETCD_CLIENT##*:} ${ETCD_PEER##*:} $API_PORT 10248 10250 10256 10257 10259; do
		ss -Hltn "sport = :$p" | grep -q . && die "port $p is in use"
	done
	seeded && die "make test's host seed (test/seed-host.sh, comment meshwire-seed) is on this host: its kube-proxy-style KUBE-* chains would become kube-proxy's; start the cluster when the tests are done"
	local t0=$SECONDS
	"$repo/test/deps.sh" cluster
	bin_dir
	log "binaries: $BIN; pods wired by $CNI"
	log "make build (log: /tmp/meshwire-cluster-make-build.log)"
	make -C "$repo" build >/tmp/meshwire-cluster-make-build.log 2>&1 || die "make build failed: /tmp/meshwire-cluster-make-build.log"
	mkdir -p "$PKI" "$KCFG" "$LOGS" "$RUN"
	trap '[ $? = 0 ] || log "up failed: the logs are in $LOGS; $0 down cleans up"' EXIT
	echo "$BIN" >"$STATE/bin"
	echo "$CNI" >"$STATE/cni-kind"
	hold_test_lock
	snapshot_host
	"$SNAPSHOT" save "$STATE/host-before.json"
	make_pki
	write_configs

	start_containerd
	import_images
	start_etcd
	start_apiserver
	wait_for "kube-apiserver ready" 90 kc get --raw /readyz
	start_controller_manager
	start_scheduler
	start_kubelet
	start_kube_proxy
	guard
	wait_for "node $NODE_NAME registered" 90 kc get node "$NODE_NAME"
	if node_ready; then die "node $NODE_NAME is Ready before a CNI config was written"; fi
	# kube-proxy's first sync (the kubernetes Service's rule), then a
	# the snapshot waits until two a second apart agree (its other family).
	wait_for "kube-proxy's rules" 60 kube_proxy_synced
	"$SNAPSHOT" save "$STATE/network-before.json"
	if [ "$CNI" = reference ]; then
		log "node $NODE_NAME registered, NotReady (no CNI config yet): installing the reference plugins"
		install_reference
	else
		log "node $NODE_NAME registered, NotReady (no CNI config yet): installing meshwire"
		install_meshwire
		wait_for "meshwire's conflist in $CNI_CONF" 120 ls "$CNI_CONF/05-meshwire.conflist"
	fi
	wait_for "node $NODE_NAME Ready" 120 node_ready
	[ "$CNI" = reference ] || kc -n kube-system rollout status ds/meshwire-node --timeout=120s >&2

	log "CoreDNS"
	kc apply -f "$here/manifests/coredns.yaml" >&2
	kc -n kube-system rollout status deploy/coredns --timeout=180s >&2
	trap - EXIT
	log "cluster up in $((SECONDS - t0))s"
	kc get nodes -o wide >&2
	kc get pods -A -o wide >&2
	echo >&2
	env_lines >&2
}

env_lines() {
	bin_dir
	echo "export KUBECONFIG=$ADMIN"
	echo "export PATH=$BIN:\$PATH"
}

# drain: delete every pod (meshwire's last, so that the plugins it
# configured run DEL for the others) and wait until kubelet has stopped
# their sandboxes, which runs the CNI DEL.
drain() {
	kc get --raw /readyz >/dev/null 2>&1 || { log "apiserver not answering: no drain"; return 0; }
	alive kubelet || { log "kubelet not running: no drain"; return 0; }
	log "draining the node"
	local ns
	for ns in $(kc get ns -o jsonpath='{.items[*].metadata.name}'); do
		case $ns in default | kube-system | kube-public | kube-node-lease) ;;
		*) kc delete ns "$ns" --wait=false >/dev/null ;;
		esac
	done
	for ns in default kube-system; do
		kc -n "$ns" delete deploy,rs,sts,job,svc -l 'app.kubernetes.io/name!=meshwire' --ignore-not-found >/dev/null 2>&1 || true
		kc -n "$ns" delete ds -l 'app.kubernetes.io/name!=meshwire' --ignore-not-found >/dev/null 2>&1 || true
		kc -n "$ns" delete pod -l 'app.kubernetes.io/name!=meshwire' --wait=false >/dev/null 2>&1 || true
	done
	wait_for "pods other than meshwire's gone" 120 only_meshwire_left || return 1
	kc -n kube-system delete ds meshwire-node --ignore-not-found >/dev/null 2>&1 || true
	wait_for "every pod gone" 60 no_pods || return 1
	wait_for "every sandbox stopped" 60 no_ready_sandbox || return 1
	# Deleting the DaemonSet took back what its installer wrote.
	if [ -e "$CNI_CONF/05-meshwire.conflist" ]; then log "meshwire's DaemonSet is gone, its conflist is not"; return 1; fi
}

# check_leaks NAME SNAPSHOT [ALLOW]: the host against SNAPSHOT; the
# differences go to the log and to $LOGS/leaks-NAME.txt.
check_leaks() {
	local name=$1 snap=$2 allow=${3:-}
	[ -f "$snap" ] || return 0
	if "$SNAPSHOT" check "$snap" -allow "$allow" -wait 60s >"$LOGS/leaks-$name.txt" 2>&1; then
		log "leak check ($name): the host matches its snapshot"
	else
		log "leak check ($name) FAILED:"
		sed 's/^/    /' "$LOGS/leaks-$name.txt" >&2
		LEAKS=1
	fi
}

only_meshwire_left() {
	[ -z "$(kc get pods -A -o jsonpath='{range .items[*]}{.metadata.labels.app\.kubernetes\.io/name}{"|"}{.metadata.name}{"\n"}{end}' | grep -v '^meshwire|')" ]
}
no_pods() { [ -z "$(kc get pods -A -o name)" ]; }
no_ready_sandbox() {
	# ctr lists the sandboxes' pause tasks: none running any more.
	! "$CTR" -a "$SOCK" -n k8s.io tasks ls 2>/dev/null | awk 'NR > 1 && $3 == "RUNNING"' | grep -q .
}

# bridge_allow: what the node keeps once every pod is gone, by design of
# the bridge plugin (meshwire's and the reference's): the bridge, its
# addresses, the routes through it, the sysctls set on it; as a regular
# expression over the snapshot's differences.
bridge_allow() {
	[ -e "/sys/class/net/$BRIDGE" ] || return 0
	local addrs
	addrs=$(ip -o addr show dev "$BRIDGE" | awk '{print $4}' | sed 's/\./\\./g' | paste -sd'|')
	echo "Ifindex: $(cat "/sys/class/net/$BRIDGE/ifindex") |[/ \"]$BRIDGE[/ ]|\"($addrs)\""
}

# The shims of this cluster's containerd (they outlive it by design).
our_shims() {
	local p
	for p in /proc/[0-9]*; do
		tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -q "containerd-shim.*-address $SOCK " && basename "$p"
	done
	return 0
}

# Mounts under the state directory, deepest first.
our_mounts() {
	awk -v s="$STATE" '$5 == s || index($5, s "/") == 1 {print $5}' /proc/self/mountinfo | sort -r
}

# seeded reports whether make test's host seed is there (test/seed-host.sh
# plays Docker, kube-proxy and portmap with rules commented meshwire-seed).
seeded() {
	{ iptables-save; ip6tables-save; iptables-legacy-save; } 2>/dev/null | grep -q meshwire-seed
}

# sweep_cni NETNS-BEFORE: what the plugins' DEL would have removed for
# sandboxes never torn down (a killed kubelet or containerd, an interrupted
# run). The CNI GC of the cluster's network (CNI 1.1) with no valid
# attachment: each plugin removes what it keeps on the host for the network
# (masquerade tables, port mappings, shaping devices). Then the network
# namespaces containerd made (cni-*) since up whose eth0 is in the pod CIDR.
sweep_cni() {
	local netns_before=$1
	[ -x "$CNI_BIN/bridge" ] || return 0
	local tmp t n addr
	tmp=$(mktemp -d /tmp/mwk-gc.XXXXXX)
	for t in bridge portmap bandwidth; do
		local extra=""
		[ "$t" = bridge ] && extra=',"bridge":"'$BRIDGE'","isGateway":true,"ipMasq":true,"ipam":{"type":"host-local","dataDir":"'$tmp'","ranges":[[{"subnet":"'$POD_CIDR'"}]]}'
		printf '{"cniVersion":"1.1.0","name":"%s","type":"%s"%s,"cni.dev/valid-attachments":[]}' "$NETWORK" "$t" "$extra" |
			CNI_COMMAND=GC CNI_PATH=$CNI_BIN "$CNI_BIN/$t" >/dev/null 2>&1 || log "CNI GC of $NETWORK by $t failed"
	done
	rm -rf "$tmp"
	local prefix=${POD_CIDR%/*} # 198.18.0.0/16: 198.18
	prefix=${prefix%.0}; prefix=${prefix%.0}
	for n in /run/netns/cni-*; do
		[ -e "$n" ] || continue
		grep -qx "${n##*/}" "$netns_before" 2>/dev/null && continue
		addr=$(nsenter --net="$n" ip -4 -o addr show dev eth0 2>/dev/null | awk '{print $4; exit}')
		case $addr in "$prefix".*)
			log "removing network namespace ${n##*/} ($addr) of a sandbox never torn down"
			ip netns del "${n##*/}" || true ;;
		esac
	done
}

IPTABLES_CMDS="iptables ip6tables iptables-legacy ip6tables-legacy"

# chains REGEX: "CMD TABLE CHAIN" of every chain whose name matches
# ^REGEX, in every table of every iptables variant.
chains() {
	local cmd t
	for cmd in $IPTABLES_CMDS; do
		command -v "$cmd" >/dev/null || continue
		for t in filter nat mangle raw; do
			"$cmd" -t "$t" -S 2>/dev/null | awk -v c="$cmd" -v t="$t" -v re="^$1" '$1 == "-N" && $2 ~ re {print c, t, $2}'
		done
	done
}

# remove_chains REGEX [BEFORE]: the chains matching ^REGEX and the rules
# that jump to them, but for those BEFORE lists (chains' output: what was
# there at up). With make test's seed on the host (it appeared meanwhile),
# its rules and the chains they use are left alone.
remove_chains() {
	local re=$1 before=${2:-/dev/null}
	if seeded; then
		log "make test's host seed is on this host: removing only the $re rules and chains it does not use"
	fi
	local cmd t chain old keep
	for cmd in $IPTABLES_CMDS; do
		command -v "$cmd" >/dev/null || continue
		for t in filter nat mangle raw; do
			"$cmd" -t "$t" -S >/dev/null 2>&1 || continue
			old=$(awk -v c="$cmd" -v t="$t" '$1 == c && $2 == t {print $3}' "$before" | tr '\n' ' ')
			keep="$old $("$cmd" -t "$t" -S 2>/dev/null | awk '/meshwire-seed/ {for (i = 1; i < NF; i++) if ($i == "-j") print $(i+1)}' | tr '\n' ' ')"
			# The rules that jump to such a chain (not one of BEFORE's)
			# from the others and from BEFORE's...
			"$cmd" -t "$t" -S 2>/dev/null | awk -v re="^$re" -v old=" $old " '$1 == "-A" && ($2 !~ re || index(old, " " $2 " ")) && !/meshwire-seed/ {
				for (i = 1; i < NF; i++) if ($i == "-j" && $(i+1) ~ re && index(old, " " $(i+1) " ") == 0) print }' |
				while read -r _ rule; do eval "\"$cmd\" -t $t -D $rule" 2>/dev/null || true; done
			# ... then the chains themselves.
			for chain in $(chains "$re" | awk -v c="$cmd" -v t="$t" '$1 == c && $2 == t {print $3}'); do
				case " $keep " in *" $chain "*) continue ;; esac
				"$cmd" -t "$t" -F "$chain" 2>/dev/null || true
			done
			for chain in $(chains "$re" | awk -v c="$cmd" -v t="$t" '$1 == c && $2 == t {print $3}'); do
				case " $keep " in *" $chain "*) continue ;; esac
				"$cmd" -t "$t" -X "$chain" 2>/dev/null || true
			done
		done
	done
}

down() {
	[ "$(id -u)" = 0 ] || die "run as root"
	[ -d "$STATE" ] || { log "no cluster at $STATE"; return 0; }
	local t0=$SECONDS
	LEAKS=0
	BIN=$(cat "$STATE/bin" 2>/dev/null || true)
	CNI=$(cat "$STATE/cni-kind" 2>/dev/null || echo meshwire)
	# With every pod and meshwire's DaemonSet deleted, the node holds
	# nothing the plugins made but the bridge (which bridge plugins keep
	# by design), as before the CNI was installed.
	if [ -n "$BIN" ] && [ -x "$BIN/kubectl" ] && drain; then
		if [ "$CNI" = reference ]; then
			# The control: what the reference plugins keep is theirs by
			# design (below, down removes it); it is listed, not judged.
			"$SNAPSHOT" check "$STATE/network-before.json" -allow "$(bridge_allow)" -wait 10s >"$LOGS/leaks-reference.txt" 2>&1 &&
				log "the reference plugins left nothing on the node" ||
				{ log "what the reference plugins left on the node once every pod was gone (by design; down removes it):"; sed 's/^/    /' "$LOGS/leaks-reference.txt" >&2; }
			cp "$LOGS/leaks-reference.txt" "${MESHWIRE_CLUSTER_E2E_REPORT:-/var/tmp/meshwire-cluster-e2e}/leaks-reference.txt" 2>/dev/null || true
		else
			check_leaks "$CNI" "$STATE/network-before.json" "$(bridge_allow)"
			[ ! -f "$STATE/host-before.ipsets" ] || check_probe_sets
		fi
	else
		log "the node was not drained: no leak check of its network"
	fi

	local c
	for c in $(echo "$COMPONENTS" | tr ' ' '\n' | tac); do
		# The kernel tests' lock goes last, after the host's leak check.
		[ "$c" = kernel-test-lock ] || stop "$c"
	done
	# kube-proxy's own clean-up of its rules, then anything KUBE- left
	# (kubelet's canary chains).
	if [ -n "$BIN" ] && [ -x "$BIN/kube-proxy" ] && ! seeded; then
		"$BIN/kube-proxy" --cleanup >"$LOGS/kube-proxy-cleanup.log" 2>&1 || true
	fi
	remove_chains '(KUBE|MWK)-'
	# What an agent with --ambient that did not stop cleanly left (the
	# leak checks reported it): its host rule, then its probe sets.
	if [ -f "$STATE/host-before.ipsets" ]; then
		remove_chains ISTIO_POSTRT "$STATE/host-before.istio-chains"
		local s; for s in $(probe_sets | grep -vxF -f "$STATE/host-before.ipsets" || true); do
			log "removing ipset $s"; ipset destroy "$s" || true
		done
	fi
	# The reference plugins' portmap chains, which it never removes (but
	# for those that were there at up).
	[ "$CNI" != reference ] || remove_chains CNI-HOSTPORT- "$STATE/host-before.chains"
	release_host
	check_leaks host "$STATE/host-before.json"
	stop kernel-test-lock
	rm -rf --one-file-system "$STATE"
	log "down in $((SECONDS - t0))s"
	[ "$LEAKS" = 0 ] || { log "error: the leak checks failed (above)"; return 1; }
}

# release_host: after containerd stopped, what its pods and the plugins may
# have left (shims, containers, mounts, network namespaces, the bridge,
# sysctls, cgroups, CNI state, host paths).
release_host() {
	local pids
	pids=$(our_shims)
	if [ -n "$pids" ]; then
		log "stopping containerd shims: $pids"
		kill -KILL $pids 2>/dev/null || true
		sleep 1
	fi
	# Containers still running (containerd or kubelet killed before the
	# drain could stop them): runc kills their processes and removes their
	# cgroups and state.
	local root id
	for root in "$STATE"/containerd/runc/*/; do
		[ -d "$root" ] || continue
		for id in $("$RUNC" --root "$root" list -q 2>/dev/null); do
			log "removing container ${id:0:12}, left running"
			"$RUNC" --root "$root" delete --force "$id" >/dev/null 2>&1 || log "runc delete --force $id failed"
		done
	done
	local m
	for m in $(our_mounts); do umount "$m" 2>/dev/null || umount -l "$m" || true; done
	[ -z "$(our_mounts)" ] || die "mounts left under $STATE: $(our_mounts | tr '\n' ' '); not removing it"

	# Host paths the cluster created.
	local before=$STATE/host-before
	sweep_cni "$before.netns"
	if [ -s "$before.bridge" ] || ! ip link show "$BRIDGE" >/dev/null 2>&1; then :; else
		log "removing bridge $BRIDGE"; ip link del "$BRIDGE" || true
	fi
	if [ "$(cat "$before.bpffs" 2>/dev/null)" = private ]; then mount --make-private /sys/fs/bpf || true; fi
	if [ "$(cat "$before.netns-mount" 2>/dev/null)" = made ] && [ -z "$(ls -A /run/netns)" ]; then umount /run/netns || true; fi
	if [ -f "$before.sysctl" ]; then
		while IFS='=' read -r k v; do
			[ "$(sysctl -n "$k" 2>/dev/null)" = "$v" ] || sysctl -q -w "$k=$v" >/dev/null 2>&1 || log "could not restore $k=$v"
		done <"$before.sysctl"
	fi
	# The pods' cgroup parent runc made in each hierarchy (containerd's
	# namespace), when empty.
	for p in $(cgroup_parents); do
		grep -qx "$p" "$before.cgroups" 2>/dev/null || rmdir "$p" 2>/dev/null || true
	done
	# The CNI state of the cluster's network (its own name: always its).
	rm -rf "/var/lib/cni/networks/$NETWORK"
	rm -f /var/lib/cni/results/"$NETWORK"-*
	local p
	if [ -f "$before.paths" ]; then
		for p in $NEW_TREES; do
			grep -qx "$p" "$before.paths" || rm -rf --one-file-system "$p"
		done
		for p in $NEW_DIRS; do
			grep -qx "$p" "$before.paths" || rmdir "$p" 2>/dev/null || true
		done
	fi
	if [ -f "$before.netns" ]; then
		for p in $(ls /run/netns 2>/dev/null); do
			grep -qx "$p" "$before.netns" || log "note: network namespace $p appeared while the cluster ran (not necessarily its own; left alone)"
		done
	fi
}

# ------------------------------------------------------------------ smoke

smoke() {
	BIN=$(cat "$STATE/bin" 2>/dev/null) || die "no cluster at $STATE"
	local ns=mwk-smoke t0=$SECONDS
	kc wait --for=delete "ns/$ns" --timeout=120s >/dev/null 2>&1 || true # a previous run's
	kc apply -f "$here/manifests/smoke.yaml" >&2
	kc -n "$ns" wait --for=condition=Ready pod/echo pod/client pod/meshed --timeout=120s >&2
	local ip
	ip=$(kc -n "$ns" get svc echo -o jsonpath='{.spec.clusterIP}')
	kc -n "$ns" get pods,svc,endpointslices -o wide >&2
	# CoreDNS caches answers for 30 s: a name of an earlier run's Service
	# may still resolve to its address; wait for the current one.
	wait_for "echo.$ns resolving to $ip" 60 bash -c "$(printf '%q ' "$BIN/kubectl" --kubeconfig "$ADMIN" -n "$ns" exec client -- nslookup "echo.$ns.svc.$CLUSTER_DOMAIN") | grep -q 'Address: $ip\$'" || true
	local ok=0 target out
	# busybox's timeout, not wget -T: Debian's static busybox 1.35 wget
	# crashes (SIGSEGV) with -T.
	for target in "$ip" "echo.$ns.svc.$CLUSTER_DOMAIN" echo; do
		if out=$(kc -n "$ns" exec client -- timeout 10 wget -q -O - "http://$target/hostname" 2>&1) && [ "$out" = echo ]; then
			log "smoke: client -> http://$target/hostname answered '$out': ok"
		else
			log "smoke: client -> http://$target/hostname: FAILED: $out"
			ok=1
		fi
	done
	# The intercept plugin: the annotated pod's inbound connections reach
	# its proxy (port 15006), not the app; the echo pod above was left
	# alone (its app answered).
	target=meshed.$ns.svc.$CLUSTER_DOMAIN
	if out=$(kc -n "$ns" exec client -- timeout 10 wget -q -O - "http://$target/" 2>&1) && [ "$out" = intercepted ]; then
		log "smoke: client -> http://$target/ (app port 8080) answered by the pod's proxy on 15006: intercepted, ok"
	else
		log "smoke: client -> http://$target/: want the proxy's 'intercepted', got: $out: FAILED"
		ok=1
	fi
	kc delete ns "$ns" --wait=true --timeout=120s >&2 || true
	[ "$ok" = 0 ] || die "smoke check failed"
	log "smoke check passed in $((SECONDS - t0))s"
}

# ------------------------------------------------------------------- mesh

MESH_NS=mwk-mesh MESH_MODES="redirect tproxy ebpf"

# render_mesh MODE: manifests/mesh.yaml for one interception mode.
render_mesh() {
	local m=$1 istio=REDIRECT uid=1337 caps='[]' mw
	mw=$(echo "$m" | tr '[:lower:]' '[:upper:]')
	case $m in tproxy) istio=TPROXY uid=0 caps='[NET_ADMIN]' ;; esac
	sed -e "s/@MODE@/$m/g" -e "s/@ISTIO_MODE@/$istio/g" -e "s/@MESHWIRE_MODE@/$mw/g" \
		-e "s/@PROXY_MODE@/$( [ "$m" = tproxy ] && echo tproxy || echo redirect)/g" \
		-e "s/@PROXY_UID@/$uid/g" -e "s/@PROXY_CAPS@/$caps/g" "$here/manifests/mesh.yaml"
}

# fastpath_field NAME: a number of `meshwire fastpath status -o json`, read
# on the host (the pins the agent made in the host's bpffs).
fastpath_field() {
	"$repo/bin/meshwire" fastpath status -o json | grep -o "\"$1\":[0-9]*" | head -1 | cut -d: -f2
}

policies_are() { [ "$(fastpath_field pod_policies)" = "$1" ]; }

# proxy_log MODE: the test proxy's records of MODE's pod (one JSON a line).
proxy_log() { kc -n "$MESH_NS" logs "deploy/app-$1" -c istio-proxy; }

# mesh_fail MESSAGE: one failed check (mesh goes on, and fails at its end).
mesh_fail() { log "mesh: FAILED: $*"; MESH_FAILED=1; }

# via_sidecar WHAT REPLY: a /clientip reply from the application is the
# sidecar's passthrough address when the connection came through it (a
# failure is counted here, once).
via_sidecar() {
	case $2 in 127.0.0.6:*) ;; *) mesh_fail "$1: the application saw '$2', not the sidecar's 127.0.0.6" ;; esac
}

# mesh_check STAGE: every mode's pod reached through its ClusterIP (from an
# outside pod, and from the next mode's meshed app: sidecar to sidecar) and
# its NodePort (from a pod and from the host); every connection through the
# sidecars, none to the status port; the fast path holding a policy per
# meshed pod; the long-lived connections alive.
mesh_check() {
	local stage=$1 m next ip np reply i outs want n fp0
	local modes=($MESH_MODES)
	fp0=$(fastpath_field redirected_messages)
	for i in 0 1 2; do
		m=${modes[$i]} next=${modes[$(((i + 1) % 3))]}
		ip=$(kc -n "$MESH_NS" get svc "app-$m" -o jsonpath='{.spec.clusterIP}')
		np=$(kc -n "$MESH_NS" get svc "app-$m" -o jsonpath='{.spec.ports[?(@.name=="http")].nodePort}')
		for target in "app-$m" "$ip" "$NODE_IP:$np"; do
			reply=$(kc -n "$MESH_NS" exec client -- timeout 10 wget -q -O - "http://$target/clientip" 2>&1) &&
				via_sidecar "$stage: client -> $m via $target" "$reply" || mesh_fail "$stage: client -> $m via $target: $reply"
		done
		reply=$(curl -sS -m 10 "http://$NODE_IP:$np/clientip" 2>&1) &&
			via_sidecar "$stage: host -> $m via NodePort $NODE_IP:$np" "$reply" || mesh_fail "$stage: host -> $m NodePort: $reply"
		# Sidecar to sidecar: next's app, through its sidecar's outbound
		# listener, to m's Service, then m's sidecar's inbound one.
		outs=$(proxy_log "$next" | grep -c "\"listener\":\"outbound\".*\"orig_dst\":\"$ip:80\"" || true)
		reply=$(kc -n "$MESH_NS" exec "deploy/app-$next" -c app -- curl -sS -m 10 "http://app-$m/clientip" 2>&1) &&
			via_sidecar "$stage: $next's app -> $m" "$reply" || mesh_fail "$stage: $next's app -> $m: $reply"
		want=$((outs + 1))
		n=$(proxy_log "$next" | grep -c "\"listener\":\"outbound\".*\"orig_dst\":\"$ip:80\"" || true)
		[ "$n" -ge "$want" ] || mesh_fail "$stage: $next's app -> $m: $next's sidecar logged $n outbound connections to $ip:80, want $want"
		# Kubelet's probes of the status port: never captured.
		n=$(proxy_log "$m" | grep -c '"orig_dst":"[^"]*:1502[01]"' || true)
		[ "$n" = 0 ] || mesh_fail "$stage: $m's sidecar got $n connections for its status ports: kubelet's probes were captured"
		log "mesh: $stage: $m: client, $next's app (sidecar to sidecar), ClusterIP $ip, NodePort $np from a pod and the host: through the sidecar"
	done
	n=$(fastpath_field pod_policies)
	[ "$n" = "$MESH_PODS" ] || mesh_fail "$stage: the fast path holds $n pod policies, want $MESH_PODS (one per meshed pod)"
	n=$(fastpath_field redirected_messages)
	[ "$n" -gt "$fp0" ] || mesh_fail "$stage: the fast path carried no message between the apps and their sidecars ($fp0 before, $n after)"
	log "mesh: $stage: the fast path carried $((n - fp0)) messages between apps and sidecars"
	n=$(fastpath_field pods)
	[ "$n" = "$MESH_EBPF_PODS" ] || mesh_fail "$stage: ebpf interception has $n pods registered, want $MESH_EBPF_PODS"
	for m in $MESH_MODES; do
		n=$(kc -n "$MESH_NS" get pod long -o jsonpath="{.status.containerStatuses[?(@.name==\"$m\")].restartCount}")
		[ "$n" = 0 ] || mesh_fail "$stage: the long-lived connection to $m broke ($n restarts)"
	done
}

# long_lines MODE: how many lines the long-lived connection to MODE echoed.
long_lines() { kc -n "$MESH_NS" logs long -c "$1" | wc -l; }

mesh() {
	BIN=$(cat "$STATE/bin" 2>/dev/null) || die "no cluster at $STATE"
	[ "$(cat "$STATE/cni-kind")" = meshwire ] || die "mesh needs a cluster whose network is meshwire"
	local t0=$SECONDS m n
	MESH_FAILED=0
	kc wait --for=delete "ns/$MESH_NS" --timeout=120s >/dev/null 2>&1 || true
	kc create namespace "$MESH_NS" >&2
	for m in $MESH_MODES; do render_mesh "$m"; echo ---; done | kc apply -f - >&2
	for m in $MESH_MODES; do kc -n "$MESH_NS" rollout status "deploy/app-$m" --timeout=120s >&2; done
	kc apply -f "$here/manifests/mesh-clients.yaml" >&2
	kc -n "$MESH_NS" wait --for=condition=Ready pod/client pod/long --timeout=120s >&2
	kc -n "$MESH_NS" get pods -o wide >&2
	MESH_PODS=3 MESH_EBPF_PODS=1
	mesh_check "before the rollout"

	# A new image tag rolled out under the running pods: the agent
	# restarts; connections stay up, and the pods' fast-path policies come
	# back from the plugin's records.
	declare -A lines
	for m in $MESH_MODES; do lines[$m]=$(long_lines "$m"); done
	local agent
	agent=$(kc -n kube-system get pods -l app.kubernetes.io/name=meshwire -o jsonpath='{.items[*].metadata.uid}')
	log "mesh: rolling out localhost/meshwire:rollout"
	kc -n kube-system set image ds/meshwire-node node=localhost/meshwire:rollout >&2
	kc -n kube-system rollout status ds/meshwire-node --timeout=180s >&2
	wait_for "node $NODE_NAME Ready" 60 node_ready
	[ "$(kc -n kube-system get pods -l app.kubernetes.io/name=meshwire -o jsonpath='{.items[*].metadata.uid}')" != "$agent" ] ||
		mesh_fail "the rollout did not replace the node agent's pod"
	kc -n kube-system logs ds/meshwire-node | grep -E 'restored|swe|collect' >&2 || true
	wait_for "the fast path's pod policies restored" 60 policies_are "$MESH_PODS" ||
		mesh_fail "after the rollout: the fast path holds $(fastpath_field pod_policies) pod policies, want $MESH_PODS"
	sleep 3
	for m in $MESH_MODES; do
		n=$(long_lines "$m")
		[ "$n" -gt "${lines[$m]}" ] || mesh_fail "after the rollout: the long-lived connection to $m echoed nothing since ($n lines)"
		log "mesh: the connection to $m held across the rollout: ${lines[$m]} lines echoed before, $n now"
	done
	# A pod started after the rollout is meshed by the new agent's plugins.
	kc -n "$MESH_NS" scale deploy/app-redirect --replicas=2 >&2
	kc -n "$MESH_NS" rollout status deploy/app-redirect --timeout=120s >&2
	MESH_PODS=4
	mesh_check "after the rollout"
	kc delete ns "$MESH_NS" --wait=true --timeout=120s >&2 || true
	n=$(fastpath_field pod_policies)
	[ "$n" = 0 ] || mesh_fail "the meshed pods are gone, the fast path still holds $n pod policies"
	[ "$MESH_FAILED" = 0 ] || die "mesh check failed (above)"
	log "mesh check passed in $((SECONDS - t0))s"
}

# ---------------------------------------------------------------- ambient

# Istio ambient mode through the API server (docs/ambient.md): meshwire's
# agent with --ambient, a ztunnel stand-in (test/proxy -zds), an app in a
# namespace labeled and unlabeled istio.io/dataplane-mode=ambient.
AMB_NS=mwk-ambient AMB_CLIENT_NS=mwk-ambient-client ZT_NS=mwk-ztunnel
AMB_LABEL=istio.io/dataplane-mode

# amb_pass/amb_fail WHAT: one check's result (ambient goes on after a
# failure, and fails at its end).
amb_pass() { log "ambient: PASS: $*"; AMB_PASSED=$((AMB_PASSED + 1)); }
amb_fail() { log "ambient: FAILED: $*"; AMB_FAILED=$((AMB_FAILED + 1)); }
# amb_check WHAT CMD...: PASS or FAILED by CMD's status.
amb_check() {
	local what=$1; shift
	if "$@"; then amb_pass "$what"; else amb_fail "$what"; fi
}
# amb_wait WHAT SECONDS CMD...: PASS once CMD succeeds, FAILED after SECONDS.
amb_wait() {
	local what=$1 limit=$2; shift 2
	if wait_for "$what" "$limit" "$@"; then amb_pass "$what"; else amb_fail "$what"; fi
}

# metric NAME: the agent's sample NAME (empty when it has none).
metric() { curl -sS -m 5 "http://$NODE_IP:9966/metrics" 2>/dev/null | awk -v n="$1" '$1 == n {print $2}'; }
metric_is() { [ "$(metric "$1")" = "$2" ]; }

# zt_pod: the stand-in's pod (not one being deleted).
zt_pod() {
	kc -n "$ZT_NS" get pods -l app=ztunnel -o jsonpath='{range .items[*]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}' |
		awk 'NF == 1 {print $1; exit}'
}
# zt_count ERE [POD]: the stand-in's JSON lines matching ERE; -1 when its
# log cannot be read (or is empty: it logs "ready" first), so that no
# check passes on a log it did not see.
zt_count() {
	local out
	out=$(kc -n "$ZT_NS" logs "${2:-$(zt_pod)}" 2>/dev/null) && [ -n "$out" ] || { echo -1; return; }
	grep -cE "$1" <<<"$out" || true
}
zt_has() { [ "$(zt_count "$@")" -gt 0 ]; }
zt_none() { [ "$(zt_count "$@")" = 0 ]; }
# The stand-in's lines, as test/proxy writes them (proxylog.Record).
zt_add() { echo "\"event\":\"add\".*\"workload\":\"$1\""; }
zt_del() { echo "\"event\":\"del\".*\"workload\":\"$1\""; }
zt_any() { echo "\"workload\":\"$1\""; }
# zt_conn LISTENER SRC-IP ORIG-DST UID
zt_conn() { echo "\"event\":\"conn\",\"listener\":\"$1\",\"src\":\"${2//./\\.}:[0-9]+\",\"orig_dst\":\"${3//./\\.}\".*\"workload\":\"$4\""; }

pod_field() { kc -n "$1" get pod "$2" -o jsonpath="$3"; }
pod_ready() { [ "$(pod_field "$1" "$2" '{.status.conditions[?(@.type=="Ready")].status}')" = True ]; }
# unhealthy NS POD: kubelet's failed probes of the pod (its events).
unhealthy() { kc -n "$1" get events --field-selector "involvedObject.name=$2,reason=Unhealthy" -o name | wc -l; }
# client_get ADDR: the app's /clientip, asked by the client (outside the mesh).
client_get() { kc -n "$AMB_CLIENT_NS" exec client -- timeout 10 wget -q -O - "http://$1/clientip" 2>&1; }
agent_log() { kc -n kube-system logs ds/meshwire-node 2>/dev/null; }
agent_says() { agent_log | grep -qF "$1"; }
zt_running() { [ -n "$(zt_pod)" ]; }
# add_answered UID: the intercept plugin's ADD of the pod (its sandbox, as
# the agent's record of the enrolled pod names it) logged the agent's
# answer "enrolled".
add_answered() {
	local cid
	cid=$(grep -l "$1" /var/lib/cni/meshwire/ambient/enrolled/* 2>/dev/null | head -1 | xargs -r cat | grep -oE '[0-9a-f]{64}' | head -1)
	[ -n "$cid" ] && grep -F "\"containerID\":\"$cid\"" "$STATE/meshwire/log/cni.log" | grep '"command":"ADD"' | grep -q '"answer":"enrolled"'
}

# probe_snat: packets the host rule gave the probe address (the counters
# of ISTIO_POSTRT, in whichever iptables has it), or "none".
probe_snat() {
	local cmd
	for cmd in iptables iptables-legacy; do
		command -v "$cmd" >/dev/null && "$cmd" -t nat -S ISTIO_POSTRT >/dev/null 2>&1 || continue
		"$cmd" -t nat -L ISTIO_POSTRT -n -v -x | awk '/SNAT/ {n += $1} END {print n + 0}'
		return
	done
	echo none
}
probe_set_has() { ipset list istio-inpod-probes-v4 2>/dev/null | grep -qE "^$1( |\$)"; }
# probe_set_empty: the probe set is there, with no member.
probe_set_empty() {
	local out
	out=$(ipset list istio-inpod-probes-v4 2>/dev/null) && ! sed -n '/^Members:/,$p' <<<"$out" | grep -qE '^[0-9]'
}
# ambient_on_host: what ambient mode puts on the host: the chain of the
# probe rule, the probe sets.
ambient_on_host() {
	chains ISTIO_ | grep -w nat || true
	ipset list -n 2>/dev/null | grep -E '^istio-inpod-probes-' || true
}

# set_ambient on|off: meshwire's DaemonSet with or without --ambient
# (the rest of its command as up installed it), rolled out.
set_ambient() {
	local i
	i=$(kc -n kube-system get ds meshwire-node -o jsonpath='{range .spec.template.spec.containers[0].command[*]}{@}{"\n"}{end}' |
		awk '$0 == "--ambient" {print NR - 1; exit}')
	case $1:$i in
	on:) kc -n kube-system patch ds meshwire-node --type=json \
		-p '[{"op":"add","path":"/spec/template/spec/containers/0/command/-","value":"--ambient"}]' >&2 ;;
	off:?*) kc -n kube-system patch ds meshwire-node --type=json \
		-p "[{\"op\":\"test\",\"path\":\"/spec/template/spec/containers/0/command/$i\",\"value\":\"--ambient\"},{\"op\":\"remove\",\"path\":\"/spec/template/spec/containers/0/command/$i\"}]" >&2 ;;
	esac
	kc -n kube-system rollout status ds/meshwire-node --timeout=180s >&2
	wait_for "node $NODE_NAME Ready" 60 node_ready
}

ambient() {
	BIN=$(cat "$STATE/bin" 2>/dev/null) || die "no cluster at $STATE"
	[ "$(cat "$STATE/cni-kind")" = meshwire ] || die "ambient needs a cluster whose network is meshwire"
	local t0=$SECONDS ns reply n n0 snat0 bad0 zt old uid
	AMB_FAILED=0 AMB_PASSED=0
	for ns in "$AMB_NS" "$AMB_CLIENT_NS" "$ZT_NS"; do kc wait --for=delete "ns/$ns" --timeout=120s >/dev/null 2>&1 || true; done

	# The app and its client start before ambient mode is on: their ADDs
	# write no record, and the app is enrolled at step 4 from its
	# processes (podnetns.Find), as a running pod is when its namespace
	# is labeled.
	log "ambient: 0. an app and its Service in $AMB_NS, not labeled, before ambient mode"
	kc apply -f "$here/manifests/ambient.yaml" >&2
	kc -n "$AMB_NS" wait --for=condition=Ready pod/app --timeout=120s >&2 || die "ambient: the app did not turn Ready"
	kc -n "$AMB_CLIENT_NS" wait --for=condition=Ready pod/client --timeout=120s >&2 || die "ambient: the client did not turn Ready"

	log "ambient: 1. meshwire's DaemonSet with --ambient"
	set_ambient on
	amb_wait "1. the agent serves ambient mode's metrics, no pod enrolled" 60 metric_is meshwire_ambient_enrolled_pods 0
	amb_check "1. the agent enrolls by the API server's labels (in-cluster config, node $NODE_NAME)" \
		agent_says "pods enrolled by the API server's labels of node $NODE_NAME"

	log "ambient: 2. the ztunnel stand-in"
	kc apply -f "$here/manifests/ambient-ztunnel.yaml" >&2
	kc -n "$ZT_NS" rollout status ds/ztunnel --timeout=120s >&2 || amb_fail "2. the stand-in's DaemonSet did not roll out"
	amb_wait "2. the ztunnel stand-in connected to the agent's ZDS socket" 60 metric_is meshwire_ambient_ztunnels_connected 1

	log "ambient: 3. the app and the client, running since before ambient mode"
	local app_uid app_ip client_uid client_ip svc_ip
	app_uid=$(pod_field "$AMB_NS" app '{.metadata.uid}') app_ip=$(pod_field "$AMB_NS" app '{.status.podIP}')
	client_uid=$(pod_field "$AMB_CLIENT_NS" client '{.metadata.uid}') client_ip=$(pod_field "$AMB_CLIENT_NS" client '{.status.podIP}')
	svc_ip=$(kc -n "$AMB_NS" get svc app -o jsonpath='{.spec.clusterIP}')
	log "ambient: app $app_ip (uid $app_uid), client $client_ip (uid $client_uid), Service $svc_ip"
	kc get pods -A -o wide >&2
	sleep 2
	amb_check "3. not labeled: no pod enrolled (metric 0)" metric_is meshwire_ambient_enrolled_pods 0
	amb_check "3. not labeled: the stand-in got no pod (no add)" zt_none '"event":"add"'
	reply=$(client_get "$svc_ip") || true
	case $reply in "$client_ip":*) amb_pass "3. client -> Service $svc_ip: the app answered directly ($reply)" ;;
	*) amb_fail "3. client -> Service $svc_ip: got '$reply'" ;; esac
	amb_check "3. that connection did not go through the stand-in" zt_none '"event":"conn"'

	log "ambient: 4. label namespace $AMB_NS $AMB_LABEL=ambient"
	snat0=$(probe_snat) || true
	bad0=$(unhealthy "$AMB_NS" app) || true
	kc label ns "$AMB_NS" "$AMB_LABEL=ambient" >&2
	amb_wait "4. the running app enrolled (metric 1)" 30 metric_is meshwire_ambient_enrolled_pods 1
	amb_check "4. ... found through its processes: it started before ambient mode, with no record" \
		agent_says "pod $AMB_NS/app started before ambient mode was on: recorded from its processes"
	amb_wait "4. the stand-in got the app (add, uid $app_uid)" 30 zt_has "$(zt_add "$app_uid")"
	amb_check "4. the app's address $app_ip is in the host's probe set" probe_set_has "$app_ip"
	reply=$(client_get "$svc_ip") || true
	case $reply in "$client_ip":*) amb_pass "4. client -> Service $svc_ip: answered, the app saw the client's own address ($reply)" ;;
	*) amb_fail "4. client -> Service $svc_ip: got '$reply'" ;; esac
	amb_check "4. that connection went through the stand-in's inbound listener (orig_dst $app_ip:8080)" \
		zt_has "$(zt_conn inbound "$client_ip" "$app_ip:8080" "$app_uid")"
	amb_check "4. the client (other namespace) is not captured: the stand-in has nothing of it" zt_none "$(zt_any "$client_uid")"
	reply=$(kc -n "$AMB_NS" exec app -- curl -sk -m 10 "https://$API_SERVICE_IP/healthz" 2>&1) || true
	[ "$reply" = ok ] && amb_pass "4. app -> kubernetes Service https://$API_SERVICE_IP/healthz: '$reply'" ||
		amb_fail "4. app -> kubernetes Service https://$API_SERVICE_IP/healthz: got '$reply'"
	amb_check "4. the app's outbound connection went through the stand-in's 15001 (orig_dst $API_SERVICE_IP:443)" \
		zt_has "$(zt_conn outbound "$app_ip" "$API_SERVICE_IP:443" "$app_uid")"
	log "ambient: 4. the app's readiness probe (every 2 s, one failure makes it NotReady) for 12 s"
	sleep 12
	amb_check "4. the app stayed Ready" pod_ready "$AMB_NS" app
	n=$(unhealthy "$AMB_NS" app) || true
	[ "$n" = "$bad0" ] && amb_pass "4. no failed probe of the app since its enrollment" || amb_fail "4. kubelet's probes of the app failed ($bad0 Unhealthy events before, $n now)"
	n=$(probe_snat)
	[ "$n" != none ] && [ "$snat0" != none ] && [ "$n" -gt "$snat0" ] && amb_pass "4. kubelet's probes left the host as 169.254.7.127 (ISTIO_POSTRT SNAT: $snat0 packets before, $n now)" ||
		amb_fail "4. the host's probe SNAT: $snat0 packets before, $n now"
	n0=$(zt_count "\"listener\":\"inbound\".*\"workload\":\"$app_uid\"")
	n=$(zt_count "$(zt_conn inbound "$client_ip" "$app_ip:8080" "$app_uid")")
	[ "$n" -gt 0 ] && [ "$n0" = "$n" ] && amb_pass "4. the probes were not captured (the stand-in's inbound saw the client's $n connections only)" ||
		amb_fail "4. the stand-in's inbound listener got $n0 connections to the app, $n of them the client's (kubelet's probes captured?)"

	log "ambient: 5, 6. pods created in the labeled namespace"
	kc apply -f "$here/manifests/ambient-late.yaml" >&2
	kc -n "$AMB_NS" wait --for=condition=Ready pod/late pod/optout pod/annotated --timeout=120s >&2 ||
		amb_fail "5, 6. pods late, optout, annotated not Ready in 120 s: $(kc -n "$AMB_NS" get pods -o wide 2>&1 | tr '\n' ' ')"
	local late_uid late_ip optout_uid annotated_uid
	late_uid=$(pod_field "$AMB_NS" late '{.metadata.uid}') late_ip=$(pod_field "$AMB_NS" late '{.status.podIP}')
	optout_uid=$(pod_field "$AMB_NS" optout '{.metadata.uid}') annotated_uid=$(pod_field "$AMB_NS" annotated '{.metadata.uid}')
	amb_check "5. the new pod late was enrolled (add, uid $late_uid)" zt_has "$(zt_add "$late_uid")"
	amb_check "5. ... at its CNI ADD: its init container's first connection went through the stand-in's 15001" \
		zt_has "$(zt_conn outbound "$late_ip" "$API_SERVICE_IP:443" "$late_uid")"
	amb_check "5. the intercept plugin's ADD of late logged the agent's answer: enrolled" add_answered "$late_uid"
	amb_check "6. the pod labeled $AMB_LABEL=none is not enrolled" zt_none "$(zt_any "$optout_uid")"
	amb_check "6. the pod annotated ambient.istio.io/redirection=disabled is enrolled, as Istio 1.23+ does (a status annotation, no opt-out)" \
		zt_has "$(zt_add "$annotated_uid")"
	amb_check "5, 6. enrolled: app, late, annotated (metric 3)" metric_is meshwire_ambient_enrolled_pods 3

	log "ambient: 8. the stand-in restarted while pods are enrolled"
	old=$(zt_pod)
	kc -n "$ZT_NS" delete pod "$old" --wait=true --timeout=60s >&2
	kc -n "$ZT_NS" rollout status ds/ztunnel --timeout=120s >&2 || amb_fail "8. the stand-in's DaemonSet did not roll out again"
	wait_for "a new stand-in pod" 60 zt_running || true
	zt=$(zt_pod)
	log "ambient: stand-in $old replaced by $zt"
	amb_wait "8. the new stand-in connected" 60 metric_is meshwire_ambient_ztunnels_connected 1
	for uid in "$app_uid" "$late_uid" "$annotated_uid"; do
		amb_wait "8. the snapshot replayed to the new stand-in: add $uid" 30 zt_has "$(zt_add "$uid")" "$zt"
	done
	n=$(zt_count "$(zt_any "$optout_uid")|$(zt_any "$client_uid")" "$zt")
	[ "$n" = 0 ] && amb_pass "8. the replay has no pod that is not enrolled" || amb_fail "8. the new stand-in got $n lines of optout or client"
	reply=$(client_get "$svc_ip") || true
	case $reply in "$client_ip":*) amb_pass "8. client -> Service after the restart: answered ($reply)" ;;
	*) amb_fail "8. client -> Service after the restart: got '$reply'" ;; esac
	amb_check "8. ... through the new stand-in's inbound listener" zt_has "$(zt_conn inbound "$client_ip" "$app_ip:8080" "$app_uid")" "$zt"
	amb_check "8. the app is still Ready" pod_ready "$AMB_NS" app

	log "ambient: 7. remove the label from namespace $AMB_NS"
	kc label ns "$AMB_NS" "$AMB_LABEL-" >&2
	amb_wait "7. every pod unenrolled (metric 0)" 30 metric_is meshwire_ambient_enrolled_pods 0
	for uid in "$app_uid" "$late_uid" "$annotated_uid"; do
		amb_wait "7. the stand-in was told: del $uid" 30 zt_has "$(zt_del "$uid")" "$zt"
	done
	amb_check "7. the host's probe set is empty" probe_set_empty
	n0=$(zt_count '"event":"conn"' "$zt")
	reply=$(client_get "$svc_ip") || true
	case $reply in "$client_ip":*) amb_pass "7. client -> Service: answered ($reply)" ;;
	*) amb_fail "7. client -> Service: got '$reply'" ;; esac
	n=$(zt_count '"event":"conn"' "$zt")
	[ "$n0" -gt 0 ] && [ "$n" = "$n0" ] && amb_pass "7. ... directly: the stand-in saw no connection" || amb_fail "7. the stand-in saw $((n - n0)) connections after the unenrollment"
	reply=$(kc -n "$AMB_NS" exec app -- curl -sk -m 10 "https://$API_SERVICE_IP/healthz" 2>&1) || true
	n=$(zt_count '"event":"conn"' "$zt")
	[ "$reply" = ok ] && [ "$n" = "$n0" ] && amb_pass "7. app -> kubernetes Service directly ('$reply', not through the stand-in)" ||
		amb_fail "7. app -> kubernetes Service: '$reply', stand-in connections $n0 before, $n after"
	amb_check "7. the app is still Ready" pod_ready "$AMB_NS" app
	log "ambient: stand-in $zt logged: $(kc -n "$ZT_NS" logs "$zt" | grep -oE '"event":"[a-z]+"(,"listener":"[a-z]+")?' | sort | uniq -c | tr -s ' \n' ' ')"

	log "ambient: enrolled pods deleted (their CNI DEL), then ambient mode turned off"
	kc label ns "$AMB_NS" "$AMB_LABEL=ambient" >&2
	amb_wait "the three pods enrolled again (metric 3)" 30 metric_is meshwire_ambient_enrolled_pods 3
	kc delete ns "$AMB_NS" "$AMB_CLIENT_NS" --wait=true --timeout=120s >&2 || true
	amb_wait "deleted enrolled pods are unenrolled (metric 0)" 30 metric_is meshwire_ambient_enrolled_pods 0
	amb_check "... and out of the probe set" probe_set_empty
	kc delete ns "$ZT_NS" --wait=true --timeout=120s >&2 || true
	set_ambient off
	n=$(ambient_on_host)
	[ -z "$n" ] && amb_pass "the agent stopped with no pod enrolled: its host rule and probe sets are gone" ||
		amb_fail "ambient mode off, the host still has: $(echo $n)"
	for f in /var/lib/cni/meshwire/ambient/agent.sock /run/ztunnel/ztunnel.sock; do
		[ -e "$f" ] && log "ambient: note: $f is still there"
	done
	n=$(find /var/lib/cni/meshwire/pods /var/lib/cni/meshwire/ambient -type f 2>/dev/null | wc -l) || true
	[ "$n" = 0 ] && amb_pass "no pod record or enrolled pod left in /var/lib/cni/meshwire" || amb_fail "$n files left under /var/lib/cni/meshwire/{pods,ambient}"

	log "ambient: $AMB_PASSED checks passed, $AMB_FAILED failed, in $((SECONDS - t0))s"
	[ "$AMB_FAILED" = 0 ] || { agent_log | grep -i ambient | tail -40 >&2; die "ambient check failed (above)"; }
	log "ambient check passed in $((SECONDS - t0))s"
}

# e2e [FOCUS [SKIP]]: Kubernetes' e2e suite (e2e.test, built by `build.sh
# e2e` when missing) against the cluster; by default the sig-network
# conformance tests that may run in parallel with others. The JUnit report
# and the log go to $MESHWIRE_CLUSTER_E2E_REPORT (outside the state
# directory: they outlive `down`).
e2e() {
	BIN=$(cat "$STATE/bin" 2>/dev/null) || die "no cluster at $STATE"
	[ -x "$BIN/e2e.test" ] || "$here/build.sh" e2e >/dev/null
	local focus=${1:-'\[sig-network\].*\[Conformance\]'} skip=${2:-'\[Serial\]|\[Disruptive\]'}
	local report=${MESHWIRE_CLUSTER_E2E_REPORT:-/var/tmp/meshwire-cluster-e2e}
	mkdir -p "$report"
	log "e2e.test --ginkgo.focus '$focus' --ginkgo.skip '$skip' (log: $report/e2e.log)"
	cd "$report"
	"$BIN/e2e.test" --kubeconfig "$ADMIN" --provider local --kubectl-path "$BIN/kubectl" \
		--dump-logs-on-failure=false --report-dir "$report" \
		--ginkgo.focus "$focus" --ginkgo.skip "$skip" --ginkgo.no-color >"$report/e2e.log" 2>&1 &&
		st=0 || st=$?
	grep -E '^ *\[FAIL\]|^Ran [0-9]|^(SUCCESS|FAIL)!' "$report/e2e.log" >&2 || true
	return "$st"
}

# podstart [OUT]: PODSTART_PODS pods (30) created at once, create-to-Ready
# times over PODSTART_ROUNDS rounds (3); JSON to OUT (podstart/main.go).
podstart() {
	BIN=$(cat "$STATE/bin" 2>/dev/null) || die "no cluster at $STATE"
	(cd "$here" && go build -o "$STATE/podstart" ./podstart) || die "building podstart failed"
	log "podstart: ${PODSTART_PODS:-30} pods at once, ${PODSTART_ROUNDS:-3} rounds, on $(cat "$STATE/cni-kind")"
	"$STATE/podstart" run -kubeconfig "$ADMIN" -pods "${PODSTART_PODS:-30}" -rounds "${PODSTART_ROUNDS:-3}" ${1:+-out "$1"} >&2
}

# on NETWORK: make the running cluster's network NETWORK (down and up when
# it is another, up when none runs).
on() {
	if [ -d "$STATE" ] && [ "$(cat "$STATE/cni-kind" 2>/dev/null)" != "$1" ]; then down || PHASE_FAILED=1; fi
	CNI=$1
	[ -d "$STATE" ] || up
}

# podstart_compare: podstart on meshwire and on the reference plugins, in
# the order meshwire, reference, reference, meshwire (a fresh cluster each
# time, PODSTART_ROUNDS rounds each), then the ratios of all of each.
podstart_compare() {
	local report=${MESHWIRE_CLUSTER_E2E_REPORT:-/var/tmp/meshwire-cluster-e2e}/podstart leg=0 cni
	PHASE_FAILED=0
	rm -rf "$report"
	mkdir -p "$report"
	for cni in meshwire reference reference meshwire; do
		leg=$((leg + 1))
		on "$cni"
		podstart "$report/$leg-$cni.json" || PHASE_FAILED=1
		down || PHASE_FAILED=1
	done
	(cd "$here" && go run ./podstart compare meshwire="$report/1-meshwire.json,$report/4-meshwire.json" \
		reference="$report/2-reference.json,$report/3-reference.json") | tee "$report/summary.txt" >&2 || PHASE_FAILED=1
	return "$PHASE_FAILED"
}

# conformance: the e2e suite (sig-network conformance) on a cluster whose
# network is meshwire, then on one whose network is the reference plugins
# v1.9.1 with the same conflist (the control), each followed by down and
# its leak checks; both Ginkgo summaries in
# $MESHWIRE_CLUSTER_E2E_REPORT/summary.txt. A meshwire cluster running at
# the start is used, and started again at the end.
conformance() {
	local report=${MESHWIRE_CLUSTER_E2E_REPORT:-/var/tmp/meshwire-cluster-e2e} st=0 restore="" cni t0=$SECONDS rev
	rev=$(git -C "$repo" describe --always --dirty)
	if [ -d "$STATE" ]; then restore=$(cat "$STATE/cni-kind" 2>/dev/null || echo meshwire); fi
	rm -rf "$report/meshwire" "$report/reference"
	PHASE_FAILED=0
	for cni in meshwire reference; do
		on "$cni"
		MESHWIRE_CLUSTER_E2E_REPORT=$report/$cni e2e || st=1
		down || st=1
	done
	[ "$PHASE_FAILED" = 0 ] || st=1
	{
		echo "cluster.sh conformance, $(date -u +%F), meshwire $rev, Kubernetes v1.34.3"
		for cni in meshwire reference; do
			echo
			echo "== $cni: e2e.test (log: $report/$cni/e2e.log)"
			grep -E '^Ran [0-9]|^(SUCCESS|FAIL)!|^ *\[FAIL\]' "$report/$cni/e2e.log" || echo "no Ginkgo summary"
		done
		echo
		echo "what the reference plugins left once every pod was gone (meshwire's leak check passed, or the run failed above):"
		sed 's/^/  /' "$report/leaks-reference.txt" 2>/dev/null || echo "  nothing"
		echo
		echo "took $(((SECONDS - t0) / 60)) min"
	} | tee "$report/summary.txt" >&2
	if [ "$restore" = meshwire ]; then CNI=meshwire; up; fi
	return "$st"
}

status() {
	local c
	for c in $COMPONENTS; do
		if alive "$c"; then echo "$c: running, pid $(cat "$RUN/$c.pid"), log $LOGS/$c.log"; else echo "$c: not running"; fi
	done
	BIN=$(cat "$STATE/bin" 2>/dev/null) || return 0
	kc get nodes -o wide 2>/dev/null || true
	kc get pods -A -o wide 2>/dev/null || true
}

# main: one function, read whole before it runs, so that editing this file
# while a long `e2e` runs does not change what bash reads next.
main() {
	case ${1:-} in
	up) up ;;
	down) down ;;
	env) BIN=$(cat "$STATE/bin" 2>/dev/null) || bin_dir; env_lines ;;
	status) status ;;
	smoke) smoke ;;
	mesh) mesh ;;
	ambient) ambient ;;
	podstart) podstart ;;
	podstart-compare) podstart_compare ;;
	conformance) conformance ;;
	e2e) shift; e2e "$@" ;;
	*) echo "usage: $0 up|down|env|status|smoke|mesh|ambient|podstart|podstart-compare|conformance|e2e [FOCUS [SKIP]]" >&2; exit 2 ;;
	esac
}

# Sourced (critest.sh), it only defines.
[ "${BASH_SOURCE[0]}" != "$0" ] || { main "$@"; exit; }
