package ipmasq

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/meshwire/meshwire/internal/firewall"
)

// CacheFile remembers the backend detected on this node (it lives on tmpfs,
// so a reboot detects again): detection runs several firewall tools, which is
// too slow to repeat on every ADD and DEL, and DEL must use the backend ADD
// used.
var CacheFile = "/run/meshwire/ipmasq-backend"

// Backend returns the configured backend (ipMasqBackend, already validated)
// or the one detected on the node.
func Backend(ctx context.Context, configured string) firewall.Backend {
	if configured != "" {
		if b, err := firewall.Parse(configured); err == nil {
			return b
		}
	}
	if data, err := os.ReadFile(CacheFile); err == nil {
		if b, err := firewall.Parse(strings.TrimSpace(string(data))); err == nil {
			return b
		}
	}
	b := firewall.Detect(ctx)
	if err := os.MkdirAll(filepath.Dir(CacheFile), 0o755); err == nil {
		tmp := CacheFile + "." + strconv.Itoa(os.Getpid())
		if os.WriteFile(tmp, []byte(b.String()+"\n"), 0o644) == nil {
			_ = os.Rename(tmp, CacheFile)
		}
	}
	return b
}

// ParseBackend validates an ipMasqBackend value as the reference plugins
// accept it ("iptables" or "nftables"; meshwire also takes the iptables
// variants "legacy" and "nft").
func ParseBackend(s string) error {
	_, err := firewall.Parse(s)
	return err
}
