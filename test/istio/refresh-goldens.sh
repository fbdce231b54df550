#!/bin/sh
# Copies Istio's golden files into test/istio/testdata from the
# istio.io/istio module at the version and hash pinned below, as the Go
# module proxy serves it. Run it to move to a newer Istio; the tests read
# only the committed copies (ORIGIN.md records where they came from).
set -eu
VERSION=v0.0.0-20260827124520-eed52ebb66ad
SUM=h1:ui9TJjRMAV/hb5ehQaZDq7IUGxuQP6dra9lapT/VjHI=
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Outside any module, so that meshwire's go.mod is not touched.
json=$(cd "$tmp" && GO111MODULE=on GOFLAGS=-mod=mod go mod download -json "istio.io/istio@$VERSION")
dir=$(printf '%s' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
sum=$(printf '%s' "$json" | sed -n 's/^[[:space:]]*"Sum": "\(.*\)",$/\1/p')
[ "$sum" = "$SUM" ] || { echo "istio.io/istio@$VERSION has hash $sum, want $SUM" >&2; exit 1; }
for p in tools/istio-iptables/pkg/capture/testdata tools/istio-nftables/pkg/capture/testdata cni/pkg/plugin/testdata \
	cni/pkg/iptables/testdata cni/pkg/nftables/testdata; do
	rm -rf "$here/testdata/$p"
	mkdir -p "$here/testdata/$p"
	cp "$dir/$p"/*.golden "$here/testdata/$p/"
	chmod 644 "$here/testdata/$p"/*
done
cp "$dir/LICENSE" "$here/testdata/LICENSE"
chmod 644 "$here/testdata/LICENSE"
(cd "$here/testdata" && find tools cni -type f | sort | xargs sha256sum) > "$here/testdata/SHA256SUMS"
echo "refreshed from istio.io/istio@$VERSION ($dir)"
