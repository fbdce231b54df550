// Package bench holds meshwire's benchmarks: the built binaries run the way
// a runtime runs them, side by side with the reference plugins from
// /usr/lib/cni in the same run, reporting medians and ratios as markdown
// tables (`make bench`).
package bench
