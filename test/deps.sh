#!/usr/bin/env bash
# Installs the system packages meshwire's tests and benchmarks use, with
# apt-get, only when something is missing. Idempotent and quiet when all is
# there already. `test/deps.sh demo` installs only what `meshwire demo`
# needs (the firewall tools its plugins and iptables-init run);
# `test/deps.sh critest` what test/cluster/critest.sh needs, `test/deps.sh
# cluster` what test/cluster/cluster.sh (make cluster) needs.
set -euo pipefail

# command-or-file => Debian package
declare -A need
# needs KEY PACKAGE...: add to what is needed.
needs() { while (($#)); do need[$1]=$2; shift 2; done; }
# containerd's CRI plugin running pods as kubelet does (test/cri, critest,
# the cluster): runc (crun refuses the hybrid cgroup layout), podman and
# busybox-static make the images (the static build: Debian's busybox
# package has /bin/busybox too), iptables for the plugins.
cri() {
  needs iptables-restore iptables ip6tables-restore iptables containerd containerd ctr containerd \
    /usr/sbin/runc runc podman podman /var/lib/dpkg/info/busybox-static.list busybox-static
}
case ${1:-} in
demo) needs iptables-restore iptables ip6tables-restore iptables ;;
critest)
  cri
  needs /usr/sbin/nginx nginx-light flock util-linux # nginx: the web server image of its port mapping specs
  ;;
cluster)
  cri
  needs openssl openssl flock util-linux findmnt util-linux
  needs curl curl # the mesh check's NodePort request from the host
  needs ipset ipset # down's leak check of ambient's probe sets (the host snapshot has no ipsets)
  # what images.sh copies into the agnhost and dnsutils images
  needs /usr/bin/wget wget /usr/bin/nc netcat-openbsd /usr/bin/dig bind9-dnsutils /usr/sbin/ip iproute2
  needs /usr/sbin/conntrack conntrack # the distroless-iptables image's (KubeProxy's CLOSE_WAIT spec)
  ;;
*)
  cri
  needs ip iproute2 tc iproute2 iptables iptables iptables-legacy iptables ip6tables iptables \
    nft nftables iperf3 iperf3 conntrack conntrack /usr/lib/cni/bridge containernetworking-plugins
  needs ipset ipset # the probe sets of ambient's host rule (test/istio)
  ;;
esac

missing=()
for what in "${!need[@]}"; do
  if [[ "$what" == /* ]]; then
    [[ -e "$what" ]] && continue
  else
    command -v "$what" >/dev/null 2>&1 && continue
  fi
  missing+=("${need[$what]}")
done

if ((${#missing[@]})); then
  pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
  echo "installing: $pkgs"
  if [[ $(id -u) -ne 0 ]]; then
    echo "test/deps.sh: need root to install $pkgs" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=300 update -qq
  # shellcheck disable=SC2086
  apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends $pkgs >/dev/null
fi

# bpffs is not mounted at boot on these machines; the eBPF fast path pins there.
if [[ $(id -u) -eq 0 ]] && ! grep -q ' /sys/fs/bpf bpf ' /proc/mounts; then
  mount -t bpf bpf /sys/fs/bpf 2>/dev/null || true
fi
