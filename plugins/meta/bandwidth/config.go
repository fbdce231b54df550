package main

import (
	"encoding/json"
	"math"
	"math/big"
	"strconv"
	"strings"

	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/cniplugin"
)

const pluginType = "bandwidth"

// rawEntry is a bandwidth object as written: the four keys of the reference
// plugin (and of the CNI conventions' "bandwidth" capability), in bits per
// second and bits. The values are kept as written and judged later, so that
// a wrong type, a negative, fractional or oversized number gets an error
// naming the field (and DEL, which needs none of them, never fails over
// them). Go's JSON matching is case-insensitive, so the capitalised keys
// containerd sends ("IngressRate") are read too.
type rawEntry struct {
	IngressRate  *bits `json:"ingressRate,omitempty"`
	IngressBurst *bits `json:"ingressBurst,omitempty"`
	EgressRate   *bits `json:"egressRate,omitempty"`
	EgressBurst  *bits `json:"egressBurst,omitempty"`
}

// bits is one value as written (JSON null leaves the pointer nil).
type bits struct{ raw json.RawMessage }

func (b *bits) UnmarshalJSON(data []byte) error {
	b.raw = append(json.RawMessage(nil), data...)
	return nil
}

type config struct {
	cniplugin.Base
	rawEntry
	RuntimeConfig struct {
		Bandwidth *rawEntry `json:"bandwidth,omitempty"`
	} `json:"runtimeConfig,omitempty"`
}

// Limit is one direction's token bucket as configured: rate in bits per
// second, burst (bucket size) in bits. The zero Limit means "not shaped".
type Limit struct {
	Rate  uint64
	Burst uint64
}

// Shaped reports whether the direction is limited.
func (l Limit) Shaped() bool { return l.Rate != 0 }

// Bandwidth is the effective, validated setting of one attachment.
type Bandwidth struct {
	Ingress Limit // traffic to the pod: tbf on the host end of the veth
	Egress  Limit // traffic from the pod: ifb + tbf
	// Source names where the setting came from ("runtimeConfig.bandwidth"
	// or "" for the plugin config), for messages and logs.
	Source string
}

// Shaped reports whether either direction is limited.
func (b Bandwidth) Shaped() bool { return b.Ingress.Shaped() || b.Egress.Shaped() }

// Kernel limits, in the units of the config (bits).
const (
	// minRate: tbf rates are whole bytes per second.
	minRate = 8
	// maxBurst: the kernel keeps bucket and queue sizes in 32-bit byte
	// counters; the reference plugin refuses bursts of 4 GiB and more the
	// same way (burst/8 >= MaxUint32).
	maxBurst = uint64(math.MaxUint32)*8 - 1
)

// parseConfig decodes stdin and resolves the effective bandwidth.
func parseConfig(data []byte) (*config, Bandwidth, error) {
	c, err := decodeConfig(data)
	if err != nil {
		return nil, Bandwidth{}, err
	}
	bw, err := c.bandwidth()
	if err != nil {
		return nil, Bandwidth{}, err
	}
	return c, bw, nil
}

// decodeConfig decodes stdin without judging the limits: DEL and GC undo
// what ADD did whatever the limits say now, and must not fail over them.
func decodeConfig(data []byte) (*config, error) {
	var c config
	if err := cniplugin.Decode(data, pluginType, &c); err != nil {
		return nil, err
	}
	return &c, nil
}

// bandwidth picks the runtime's bandwidth capability when present (a
// runtime sets it per pod, so it wins over the network-wide plugin config,
// as a whole object: a direction it leaves out is not shaped) and
// validates it.
func (c *config) bandwidth() (Bandwidth, error) {
	if rt := c.RuntimeConfig.Bandwidth; rt != nil {
		return resolveEntry(rt, "runtimeConfig.bandwidth")
	}
	return resolveEntry(&c.rawEntry, "")
}

func resolveEntry(r *rawEntry, prefix string) (Bandwidth, error) {
	bw := Bandwidth{Source: prefix}
	var err error
	if bw.Ingress, err = resolveLimit(r.IngressRate, r.IngressBurst, prefix, "ingress"); err != nil {
		return Bandwidth{}, err
	}
	if bw.Egress, err = resolveLimit(r.EgressRate, r.EgressBurst, prefix, "egress"); err != nil {
		return Bandwidth{}, err
	}
	return bw, nil
}

func fieldName(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// resolveLimit validates one direction. Both values zero or absent mean the
// direction is not shaped (the reference reads it so, and containerd sends
// zeros for the direction a pod does not limit).
func resolveLimit(rate, burst *bits, prefix, dir string) (Limit, error) {
	rateField, burstField := fieldName(prefix, dir+"Rate"), fieldName(prefix, dir+"Burst")
	r, err := wholeBits(rate, rateField)
	if err != nil {
		return Limit{}, err
	}
	b, err := wholeBits(burst, burstField)
	if err != nil {
		return Limit{}, err
	}
	return validateLimit(r, b, rateField, burstField)
}

// validateLimit is the decision on one direction's numbers.
func validateLimit(rate, burst uint64, rateField, burstField string) (Limit, error) {
	switch {
	case rate == 0 && burst == 0:
		return Limit{}, nil
	case burst == 0:
		return Limit{}, cnierr.Field(burstField, "must be set (a positive number of bits) when %s is set", rateField)
	case rate == 0:
		return Limit{}, cnierr.Field(rateField, "must be set (a positive number of bits per second) when %s is set", burstField)
	case rate < minRate:
		return Limit{}, cnierr.Field(rateField, "%d bit/s is below the kernel's resolution of 8 bit/s (one byte per second)", rate)
	case burst < 8:
		return Limit{}, cnierr.Field(burstField, "%d bits is less than one byte", burst)
	case burst > maxBurst:
		return Limit{}, cnierr.Field(burstField, "%d bits is beyond the kernel's limit of 4 GiB (%d bits)", burst, maxBurst)
	}
	return Limit{Rate: rate, Burst: burst}, nil
}

// wholeBits reads a non-negative whole number, written as a JSON number or
// a string holding one. Integers in exponent form ("1e6") are accepted;
// anything else is an error naming the field.
func wholeBits(b *bits, field string) (uint64, error) {
	if b == nil {
		return 0, nil
	}
	var s string
	if err := json.Unmarshal(b.raw, &s); err != nil {
		var n json.Number
		if err := json.Unmarshal(b.raw, &n); err != nil {
			return 0, cnierr.Field(field, "expected a number, got %s", b.raw)
		}
		s = n.String()
	}
	s = strings.TrimSpace(s)
	if v, err := strconv.ParseUint(s, 10, 64); err == nil {
		return v, nil
	}
	f, ok := new(big.Float).SetPrec(256).SetString(s)
	if !ok || f.IsInf() {
		return 0, cnierr.Field(field, "%q is not a number", s)
	}
	if f.Sign() < 0 {
		return 0, cnierr.Field(field, "%s is negative: rates and bursts are positive numbers of bits", s)
	}
	if !f.IsInt() {
		return 0, cnierr.Field(field, "%s is not a whole number of bits", s)
	}
	v, acc := f.Uint64()
	if acc != big.Exact {
		return 0, cnierr.Field(field, "%s is too large", s)
	}
	return v, nil
}
