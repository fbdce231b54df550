package main

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/intercept"
	"github.com/meshwire/meshwire/internal/intercept/apply"
)

// TestReport pins what ADD logs of each outcome of apply.Install.
func TestReport(t *testing.T) {
	ipt := firewall.Backend{Kind: firewall.IPTables, Variant: firewall.VariantNFT}
	d := decision{Intercept: true, Why: "the pod has an Istio sidecar"}
	unavailable := errors.New("not attached")
	cases := []struct {
		name string
		out  apply.Outcome
		err  error
		want []string // one line each, in order
	}{
		{"installed", apply.Outcome{Mode: intercept.ModeTProxy, Backend: ipt, Request: apply.Request{IPv6: true}}, nil,
			[]string{`level=INFO msg="interception rules installed" why="the pod has an Istio sidecar" mode=TPROXY ipv6=true backend=iptables-nft alreadyInPlace=false`}},
		{"ebpf", apply.Outcome{Mode: intercept.ModeEBPF}, nil,
			[]string{`level=INFO msg="pod registered for ebpf interception (no netfilter rule)" why="the pod has an Istio sidecar"`}},
		{"fallback", apply.Outcome{Mode: intercept.ModeRedirect, FellBack: unavailable, Backend: ipt, UpToDate: true}, nil,
			[]string{`level=WARN msg="this node cannot capture the pod in ebpf mode; installing the fallback mode's rules" mode=REDIRECT error="not attached"`,
				`level=INFO msg="interception rules installed" why="the pod has an Istio sidecar" mode=REDIRECT ipv6=false backend=iptables-nft alreadyInPlace=true`}},
		{"failed", apply.Outcome{Mode: intercept.ModeRedirect}, errors.New("refused"), nil},
		{"failed, undo failed", apply.Outcome{Mode: intercept.ModeRedirect, UndoErr: errors.New("gone")}, errors.New("refused"),
			[]string{`level=WARN msg="undoing a failed ADD" error=gone`}},
	}
	defer slog.SetDefault(slog.Default())
	for _, tc := range cases {
		var b bytes.Buffer
		slog.SetDefault(slog.New(slog.NewTextHandler(&b, &slog.HandlerOptions{
			ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			}})))
		report(tc.out, tc.err, d)
		var got []string
		if s := strings.TrimSpace(b.String()); s != "" {
			got = strings.Split(s, "\n")
		}
		if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, tc.want)
		}
	}
}
