#!/usr/bin/env bash
# Installs the system packages meshwire's tests and benchmarks use, with
# apt-get, only when something is missing. Idempotent and quiet when all is
# there already.
set -euo pipefail

# command-or-file => Debian package
declare -A need=(
  [ip]=iproute2
  [tc]=iproute2
  [iptables]=iptables
  [iptables-legacy]=iptables
  [ip6tables]=iptables
  [nft]=nftables
  [iperf3]=iperf3
  [conntrack]=conntrack
  [/usr/lib/cni/bridge]=containernetworking-plugins
)

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
  apt-get update -qq
  # shellcheck disable=SC2086
  apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
fi

# bpffs is not mounted at boot on these machines; the eBPF fast path pins there.
if [[ $(id -u) -eq 0 ]] && ! grep -q ' /sys/fs/bpf bpf ' /proc/mounts; then
  mount -t bpf bpf /sys/fs/bpf 2>/dev/null || true
fi
