package main

import (
	"reflect"
	"strings"
	"testing"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/intercept"
)

func conf(extra string) []byte {
	if extra != "" {
		extra = "," + extra
	}
	return []byte(`{"cniVersion":"1.0.0","name":"mesh","type":"intercept"` + extra + `}`)
}

func TestParseConfig(t *testing.T) {
	_, o, err := parseConfig(conf(`"istio-service-cidr":"*","istio-inbound-ports":[80,"443"],"istio-inbound-interception-mode":"TPROXY",
		"proxy-uid":1337,"proxy-gid":[1337,2000],"istio-service-exclude-cidr":["10.1.0.0/16","fd70:1::/64"],"redirect-dns":true,
		"iptables-backend":"nftables","dual-stack":true,"envoy-port":"16001","someRuntimeKey":{"x":1}`))
	if err != nil {
		t.Fatal(err)
	}
	c := o.Config
	if !c.OutboundCIDRs.All || !reflect.DeepEqual(c.InboundPorts.Ports, []uint16{80, 443}) || c.Mode != intercept.ModeTProxy ||
		!reflect.DeepEqual(c.ProxyGIDs, []uint32{1337, 2000}) || len(c.OutboundCIDRsExclude) != 2 || !c.RedirectDNS ||
		o.Backend.Kind != firewall.NFTables || !o.DualStack || c.ProxyPort != 16001 {
		t.Fatalf("parsed %+v / %+v", c, o)
	}
	// Defaults are iptables-init's.
	_, o, err = parseConfig(conf(""))
	if err != nil || o.Config.ProxyPort != 15001 || !o.Config.InboundPorts.Empty() || o.Config.OutboundCIDRs.All {
		t.Fatalf("defaults %+v, %v", o.Config, err)
	}
	if got := o.Config.OutboundCIDRsExclude; got != nil {
		t.Fatalf("exclude %v", got)
	}
	// A key of 0 is uid 0, as iptables-init's -u 0 (istio-cni's "0 keeps
	// the default" is about the pod spec's runAsUser, which no runtime
	// passes: docs/intercept.md, test/istio's custom-uid-zero).
	_, o, err = parseConfig(conf(`"proxy-uid":0`))
	if err != nil || !reflect.DeepEqual(o.Config.ProxyUIDs, []uint32{0}) || !reflect.DeepEqual(o.Config.ProxyGIDs, []uint32{0}) {
		t.Fatalf("proxy-uid 0: uids %v gids %v, %v", o.Config.ProxyUIDs, o.Config.ProxyGIDs, err)
	}
}

func TestParseConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		extra string
		code  uint
		field string
	}{
		{`"envoy-port":0`, 7, "envoy-port"},
		{`"envoy-port":true`, 7, "envoy-port"},
		{`"istio-service-cidr":"10.0.0.0/40"`, 7, "istio-service-cidr"},
		{`"istio-inbound-interception-mode":"NAT"`, 7, "istio-inbound-interception-mode"},
		{`"redirect-dns":"yes"`, 7, "redirect-dns"},
		{`"ebpf-fallback":"EBPF"`, 7, "ebpf-fallback"},
		{`"istio-inbound-ports":[{"a":1}]`, 7, "istio-inbound-ports"},
		{`"dry-run":true`, 7, "dry-run"},
		{`"cleanup-only":true`, 7, "cleanup-only"},
		{`"inbound-capture-port":15001`, 7, "inbound-capture-port"},
		{`"iptables-backend":"pf"`, 7, "iptables-backend"},
	} {
		_, _, err := parseConfig(conf(tc.extra))
		if cnierr.Code(err) != tc.code || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v (code %d), want code %d naming %s", tc.extra, err, cnierr.Code(err), tc.code, tc.field)
		}
	}
	if _, _, err := parseConfig([]byte(`{"type":`)); cnierr.Code(err) != 6 {
		t.Errorf("broken JSON: %v", err)
	}
	if _, _, err := parseConfig([]byte(`{"cniVersion":"1.0.0","name":"x","type":"bridge"}`)); cnierr.Code(err) != 7 {
		t.Errorf("wrong type: %v", err)
	}
}
