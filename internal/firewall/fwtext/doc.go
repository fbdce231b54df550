// Package fwtext is the firewall's text: typed transactions, tables,
// chains and rules (package ruleset) rendered as the tools read them, and
// the tools' output parsed back into package installed's values.
//
// One file per format: iptables.go (iptables-restore payloads, every
// rule's iptables arguments and quoting, iptables-save parsed back, Ref,
// which names a rule for its deletion) and nft.go (nft scripts, with the
// one nft quoting rule, Quote); render.go splits a transaction by address
// family, and legacy.go holds legacy iptables' tool-free reads (/proc and
// one getsockopt).
package fwtext
