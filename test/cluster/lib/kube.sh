# shellcheck shell=bash
# kube.sh: Kubernetes' own processes, every flag in one place, in the shape
# of hack/local-up-cluster.sh: certificates and kubeconfigs made on the
# fly, the control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler) on the host, and the configs of each node's kubelet and
# kube-proxy. Sourced by cluster.sh after common.sh; defines only. The
# caller sets API_IP (the address the apiserver advertises and the
# kubeconfigs name), POD_CIDR, NODE_CIDR_MASK, SERVICE_CIDR and the DNS
# settings, and lib/ipfamily.sh's (POD_CIDRS, SERVICE_CIDRS,
# NODE_CIDR_MASK_FLAGS, node_ips, ipfamily_san: IPv4 and IPv6 in dual
# stack).

API_PORT=6443
ETCD_CLIENT=127.0.0.1:2379
ETCD_PEER=127.0.0.1:2380

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
    server: https://$API_IP:$API_PORT
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

# make_pki: the CA, the control plane's and kube-proxy's certificates and
# kubeconfigs (each node's: node_pki).
make_pki() {
	log "certificates and kubeconfigs in $PKI, $KCFG"
	openssl req -x509 -new -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -out "$PKI/ca.crt" \
		-days 30 -subj "/CN=meshwire-cluster-ca" 2>/dev/null
	cert apiserver kube-apiserver "" serverAuth \
		"IP:$API_SERVICE_IP,IP:$API_IP,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$CLUSTER_DOMAIN"
	cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters clientAuth
	cert admin admin system:masters clientAuth
	cert controller-manager system:kube-controller-manager "" clientAuth
	cert scheduler system:kube-scheduler "" clientAuth
	cert kube-proxy system:kube-proxy "" clientAuth
	openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
	openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
	kubeconfig admin admin
	kubeconfig controller-manager controller-manager
	kubeconfig scheduler scheduler
	kubeconfig kube-proxy kube-proxy
}

# node_pki NAME IP: the node's kubelet client and serving certificates and
# its kubelet's kubeconfig, kubelet-NAME.
node_pki() {
	cert "kubelet-$1" "system:node:$1" system:nodes clientAuth
	cert "kubelet-serving-$1" "$1" "" serverAuth "IP:$2$(ipfamily_san "$2"),IP:127.0.0.1,DNS:$1"
	kubeconfig "kubelet-$1" "kubelet-$1"
}

# ------------------------------------------------------------- node configs

# kubelet_config FILE SOCKET ADDRESS NAME: kubelet's config: cgroupfs without
# per-QoS cgroups on this hybrid cgroup layout (with them when
# POD_CGROUPS=1: kubepods/QOS/podUID/), no swap check, no image
# garbage collection (there is no registry to pull a collected image from
# again), eviction only on memory and a nearly full disk.
kubelet_config() {
	mkdir -p "$(dirname "$1")"
	cat >"$1" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$2
imageServiceEndpoint: unix://$2
cgroupDriver: cgroupfs
cgroupsPerQOS: $([ "${POD_CGROUPS:-0}" = 1 ] && echo true || echo false)
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $PKI/kubelet-serving-$4.crt
tlsPrivateKeyFile: $PKI/kubelet-serving-$4.key
address: $3
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
}

# kube_proxy_config FILE NAME [netns]: kube-proxy in PROXY_MODE (iptables
# or nftables); it leaves route_localnet and the conntrack table's size
# (one for the whole machine) alone. A node with a network namespace of
# its own (netns) gets kube-proxy's conntrack timeouts, as a kind node
# does (they are the namespace's: KubeProxy's CLOSE_WAIT spec reads them);
# the one node that shares the host's keeps the host's.
kube_proxy_config() {
	local timeouts="  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s"
	[ "${3:-}" = netns ] && timeouts="  tcpEstablishedTimeout: 24h0m0s
  tcpCloseWaitTimeout: 1h0m0s"
	mkdir -p "$(dirname "$1")"
	cat >"$1" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: $PROXY_MODE
clientConnection: {kubeconfig: $KCFG/kube-proxy.kubeconfig}
hostnameOverride: $2
clusterCIDR: ${POD_CIDRS:-$POD_CIDR}
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack:
  maxPerCore: 0
  min: 0
$timeouts
iptables:
  localhostNodePorts: false
EOF
}

# ------------------------------------------------------------ control plane

start_etcd() {
	start etcd "$BIN/etcd" --name mwk --data-dir "$STATE/etcd" \
		--listen-client-urls "http://$ETCD_CLIENT" --advertise-client-urls "http://$ETCD_CLIENT" \
		--listen-peer-urls "http://$ETCD_PEER" --initial-advertise-peer-urls "http://$ETCD_PEER" \
		--initial-cluster "mwk=http://$ETCD_PEER" --log-level warn
}

# audit_policy FILE: the API server's audit policy: every request at
# Metadata level (who, which verb on what, when; no body), logged once it
# is answered (no RequestReceived stage), so that the suites can count
# the requests of each client (TestIstioPodStartCompare: API requests per
# pod ADD, by user agent).
audit_policy() {
	mkdir -p "$(dirname "$1")"
	cat >"$1" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
EOF
}

start_apiserver() {
	audit_policy "$STATE/config/audit-policy.yaml"
	start kube-apiserver "$BIN/kube-apiserver" \
		--audit-policy-file "$STATE/config/audit-policy.yaml" \
		--audit-log-path "$LOGS/audit.log" --audit-log-maxsize 200 --audit-log-maxbackup 2 \
		--etcd-servers "http://$ETCD_CLIENT" \
		--advertise-address "$API_IP" --secure-port "$API_PORT" \
		--service-cluster-ip-range "${SERVICE_CIDRS:-$SERVICE_CIDR}" \
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
		--service-cluster-ip-range "${SERVICE_CIDRS:-$SERVICE_CIDR}" \
		--allocate-node-cidrs --cluster-cidr "${POD_CIDRS:-$POD_CIDR}" "${NODE_CIDR_MASK_FLAGS[@]}" \
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

# start_kubelet NAME IP CONFIG ROOT [PREFIX...]: the node's kubelet, run
# through PREFIX (nodens.sh enter, for a node in namespaces of its own).
start_kubelet() {
	local name=$1 ip=$2 config=$3 root=$4; shift 4
	start "$(proc "$name" kubelet)" "$@" "$BIN/kubelet" \
		--config "$config" \
		--kubeconfig "$KCFG/kubelet-$name.kubeconfig" \
		--hostname-override "$name" --node-ip "$(node_ips "$ip")" \
		--root-dir "$root" --cert-dir "$root/pki" \
		--v 1
}

# start_kube_proxy NAME CONFIG [PREFIX...]
start_kube_proxy() {
	local name=$1 config=$2; shift 2
	start "$(proc "$name" kube-proxy)" "$@" "$BIN/kube-proxy" --config "$config"
}
