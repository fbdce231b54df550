# shellcheck shell=bash
# image.sh: an image made without a registry, for images.sh and peers.sh:
# a root file system as a tar, `podman import` into a podman store of the
# caller's own ($work/store: vfs, removed with $work), `podman save
# --format docker-archive` into $out, which `ctr images import` reads, and
# a line for $out/index.new. Sourced; defines only.

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
