#!/bin/sh
# Builds an iptables release from the upstream source Debian packages, into
# a prefix that TestCodecRulesReadByIPTablesVersions tests when
# MESHWIRE_IPTABLES_NFT names it:
#
#   internal/nftnl/testdata/build-iptables.sh trixie 1.8.11-2 /opt/codec-iptables-1.8.11
#   MESHWIRE_IPTABLES_NFT=/opt/codec-iptables-1.8.11 go test -run TestCodecRulesReadByIPTablesVersions ./internal/nftnl/
#
# Debian 13's 1.8.11 asks for libnftnl >= 1.2.6 but builds and runs with
# Debian 12's 1.2.4 (the only libnftnl whose package is reachable here).
set -eu
suite=$1 version=$2 prefix=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
command -v gcc >/dev/null && dpkg -s libnftnl-dev libmnl-dev pkg-config >/dev/null 2>&1 ||
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q gcc make pkg-config libnftnl-dev libmnl-dev >/dev/null
mkdir -p "$work/lists/partial"
echo "deb-src http://deb.debian.org/debian $suite main" >"$work/sources.list"
apt="-o Dir::Etc::sourcelist=$work/sources.list -o Dir::Etc::sourceparts=/nonexistent -o Dir::State::Lists=$work/lists"
apt-get $apt update -q >/dev/null
# Only the upstream tarball is needed (Debian's patches are packaging).
(cd "$work" && apt-get $apt source --download-only "iptables=$version" >/dev/null 2>&1 || true)
tarball=$(ls "$work"/iptables_*.orig.tar.* | head -n 1)
tar -xf "$tarball" -C "$work"
cd "$work"/iptables-*/
sed -i 's/libnftnl >= 1\.2\.[0-9]*/libnftnl >= 1.2.4/' configure
./configure -q --prefix="$prefix" --with-xtlibdir="$prefix/lib/xtables" >/dev/null
make -s -j"$(nproc)" >"$work/make.log" 2>&1 && make -s install >>"$work/make.log" 2>&1 ||
	{ cat "$work/make.log"; exit 1; }
LD_LIBRARY_PATH="$prefix/lib" "$prefix/sbin/iptables-nft" --version
