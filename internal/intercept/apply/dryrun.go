package apply

import (
	"fmt"
	"strings"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/firewall/fwtext"
	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/ruleset"
)

// String renders the plan as what would be run (the dry-run output).
func (p *Plan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# backend: %s\n", p.Backend)
	for _, s := range p.Add {
		fmt.Fprintf(&b, "# %s\n", s)
	}
	for _, f := range bothFamilies {
		if !p.Restore[f].Empty() {
			fmt.Fprintf(&b, "# %s --noflush\n%s", restoreTool(p.Backend, f), text(p.Backend, p.Restore[f]))
		}
	}
	if !p.Nft.Empty() {
		fmt.Fprintf(&b, "# nft -f -\n%s", text(p.Backend, p.Nft))
	}
	for _, s := range p.Remove {
		fmt.Fprintf(&b, "# remove if present: %s\n", s)
	}
	for _, o := range p.Others {
		fmt.Fprintf(&b, "# remove meshwire's rules from %s\n", o)
	}
	if p.UpToDate() {
		b.WriteString("# rules already installed as asked: nothing to do\n")
	}
	return b.String()
}

// text renders a transaction as the tool of b would get it (the dry
// run's output).
func text(b firewall.Backend, tx *ruleset.Tx) string {
	return fwtext.Text(tx, b.Kind == firewall.NFTables)
}

// restoreTool names the iptables-restore of a backend and family.
func restoreTool(b firewall.Backend, f intercept.Family) string {
	tool := "iptables"
	if f == intercept.V6 {
		tool = "ip6tables"
	}
	if b.Variant != firewall.VariantDefault {
		tool += "-" + string(b.Variant)
	}
	return tool + "-restore"
}
