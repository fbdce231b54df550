#!/usr/bin/env bash
# Makes the root file system of meshwire's image from this machine's Debian
# packages, with no registry: meshwire's binaries, the iptables (nft and
# legacy) and nftables tools iptables-init runs, the shared libraries they
# load (found with ldd), iptables' extensions, and busybox for a shell.
#
#   rootfs.sh BIN_DIR OUT_DIR
set -euo pipefail
bin=$1 out=$2
need=(iptables nftables busybox-static)
missing=()
for p in "${need[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

rm -rf "$out"
mkdir -p "$out"/{usr/local/bin,usr/bin,usr/sbin,usr/lib,usr/lib64,etc,tmp,run}
chmod 1777 "$out/tmp"
# Merged /usr, as on Debian 12: libraries are copied at their /usr paths.
for d in bin sbin lib lib64; do ln -s "usr/$d" "$out/$d"; done

# meshwire: the commands and the plugins, side by side (`meshwire install`
# copies the plugins from the directory of the meshwire binary).
for f in "$bin"/*; do
  [[ -f "$f" && -x "$f" ]] && install -m 0755 "$f" "$out/usr/local/bin/"
done

# put FILE: copy it at its real path (symlinks resolved, /usr merged).
put() {
  local real
  real=$(readlink -f "$1")
  [[ -e "$out$real" ]] && return 0
  mkdir -p "$out$(dirname "$real")"
  cp "$real" "$out$real"
}

# copy_with_libs FILE: the file and every library ldd names, and the names
# the loader looks them up by (symlinks like libc.so.6 -> libc-2.36.so).
copy_with_libs() {
  put "$1"
  ldd "$1" 2>/dev/null | awk '/=> \//{print $3} /^\t\//{print $1}' | while read -r lib; do
    put "$lib"
    local name real
    real=$(readlink -f "$lib")
    name=$(readlink -f "$(dirname "$lib")")/$(basename "$lib")
    [[ "$name" != "$real" && ! -e "$out$name" ]] && ln -s "$real" "$out$name"
    true
  done
}

for tool in /usr/sbin/xtables-nft-multi /usr/sbin/xtables-legacy-multi /usr/sbin/nft; do
  copy_with_libs "$tool"
done
# iptables' extensions, with their symlinked names (libxt_REDIRECT.so is
# libxt_NAT.so), and the libraries they need.
cp -a /usr/lib/x86_64-linux-gnu/xtables "$out/usr/lib/x86_64-linux-gnu/"
for ext in /usr/lib/x86_64-linux-gnu/xtables/*.so; do copy_with_libs "$ext"; done
# The tool names iptables-init runs, as Debian's alternatives point them.
for v in iptables ip6tables; do
  for s in "" -save -restore; do
    ln -sf xtables-nft-multi "$out/usr/sbin/$v-nft$s"
    ln -sf xtables-legacy-multi "$out/usr/sbin/$v-legacy$s"
    ln -sf "$v-nft$s" "$out/usr/sbin/$v$s"
  done
done

cp /bin/busybox "$out/bin/busybox"
for app in sh sleep cat ls ip; do ln -sf busybox "$out/bin/$app"; done

cp /etc/protocols /etc/services "$out/etc/" 2>/dev/null || true
printf 'root:x:0:0:root:/:/bin/sh\nistio-proxy:x:1337:1337::/:/bin/sh\n' >"$out/etc/passwd"
printf 'root:x:0:\nistio-proxy:x:1337:\n' >"$out/etc/group"
