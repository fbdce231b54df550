package firewall

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/meshwire/meshwire/internal/nodelayout"
)

// CacheFile remembers the backend Detect picked for this node's host
// network namespace: detection runs several firewall tools, too slow to
// repeat on every ADD and DEL, and a DEL must use the backend its ADD used.
// It has one meaning, for every plugin: "the node's detected backend". It
// lives on tmpfs, so a reboot detects again, and nothing removes it before.
// Tests point it elsewhere.
var CacheFile = nodelayout.FirewallBackendCache

// OldCacheFiles are where earlier meshwire versions cached the same
// detection (ipmasq and portmap kept one each). They are read, never
// written, when CacheFile is absent, so that a node upgraded with pods in
// place keeps the backend their ADDs used.
var OldCacheFiles = nodelayout.LegacyFirewallBackendCaches

// Resolve returns the backend to program in the host network namespace:
// the configured one (a name Parse accepts) as is; else the node's cached
// detection (CacheFile, then OldCacheFiles); else Detect, whose answer is
// cached when the backend is Usable (a detection of iptables on a node
// with no firewall tool is made again once someone installs one; native
// nftables, which meshwire writes over netlink, is kept). Only a
// configured name that Parse refuses is an error.
//
// The cache describes the host namespace: code that programs another
// namespace (intercept, in a pod's) calls Detect there instead.
func Resolve(ctx context.Context, configured string) (Backend, error) {
	if configured != "" {
		return Parse(configured)
	}
	if b, ok := Cached(); ok && b.Usable() {
		return b, nil
	}
	b := Detect(ctx)
	if b.Usable() {
		Remember(b)
	}
	return b, nil
}

// Cached returns the node's cached detection, if any.
func Cached() (Backend, bool) {
	for _, p := range append([]string{CacheFile}, OldCacheFiles...) {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if b, err := Parse(strings.TrimSpace(string(data))); err == nil {
			return b, true
		}
	}
	return Backend{}, false
}

// Remember writes b as the node's detected backend (atomically; a failure
// only means the next command detects again).
func Remember(b Backend) {
	if err := os.MkdirAll(filepath.Dir(CacheFile), 0o755); err != nil {
		return
	}
	tmp := CacheFile + "." + strconv.Itoa(os.Getpid())
	if os.WriteFile(tmp, []byte(b.String()+"\n"), 0o644) == nil {
		if os.Rename(tmp, CacheFile) != nil {
			_ = os.Remove(tmp)
		}
	}
}

// NewHost is New of the backend Resolve picks: the firewall of the host
// network namespace as a plugin configured with configured uses it.
func NewHost(ctx context.Context, configured string) (*Host, error) {
	b, err := Resolve(ctx, configured)
	if err != nil {
		return nil, err
	}
	return New(b), nil
}
