// Package bench holds meshwire's benchmarks: the built binaries run the way
// a runtime runs them, side by side in the same run with two peers, the
// newest reference plugins (v1.9.1, built by the benchmarks from the Go
// module proxy) and Debian's older 1.1.1 (/usr/lib/cni), taking turns in
// rotating order on a settled machine, reporting medians and ratios against
// each peer as markdown tables (`make bench`).
package bench
