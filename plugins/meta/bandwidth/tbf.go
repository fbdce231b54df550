package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/meshwire/meshwire/internal/attachment"
)

// Queue sizing. A token bucket filter has two sizes: the bucket (burst: how
// much may leave at line rate after an idle period, set by the user) and
// the queue in front of it (tbf's "limit": how much may wait for tokens).
// The reference plugin sizes the queue as 25 ms of traffic plus the whole
// burst, so a pod with a large burst (containerd and CRI-O pass 2^32-1
// bits) gets a queue of up to half a gigabyte, and every packet behind a
// bulk transfer waits as long as it takes to drain. meshwire sizes the
// queue from the rate, with a floor that depends on the bucket only up to
// one packet:
//
//	limit = rate × 5 ms + max(16 full-size frames, min(bucket, 72 KiB))
//
// The first term bounds the wait behind a full queue to about 5 ms at high
// rates. The second is room for what one TCP GSO packet puts in the queue
// at once: tbf cuts a GSO packet larger than the bucket into frames and
// queues them all together (16 frames cover the GSO packets TCP sends at
// the low rates where 5 ms is a frame or two: without them a 4 Mbit/s limit
// gave 3.2 instead of 3.8 Mbit/s), and queues a packet smaller than the
// bucket whole, so with a large bucket the queue must take a whole 64 KiB
// GSO packet (without that, 10 Mbit/s with containerd's burst gave 6-7
// Mbit/s).
const (
	queueLatencyUsec = 5000
	queueFrames      = 16
	// maxGSOPacket is the largest packet tbf sees on a veth with default
	// settings, as the qdisc counts it: a 64 KiB GSO packet plus the headers
	// of each of its segments.
	maxGSOPacket = 72 * 1024
	// ethHeader: a full-size frame is the MTU plus the Ethernet header.
	ethHeader = 14
	// maxBucketUsec: the kernel keeps at most 2^32-1 ns of tokens in a tbf
	// bucket (longer buffers are cut to that); meshwire asks for no more,
	// so that what CHECK reads back equals what ADD asked for.
	maxBucketUsec = 4294967
)

// tbfParams are the values handed to the kernel for one direction.
type tbfParams struct {
	Rate   uint64 // bytes per second
	Buffer uint32 // bucket, in psched ticks (the kernel's unit)
	Limit  uint32 // queue, in bytes
	// Bucket is the bucket in bytes after the adjustments below, for logs.
	Bucket uint64
}

// tbfFor turns a configured Limit into tbf parameters for a device with the
// given MTU. tickInUsec is the kernel's psched ticks per microsecond
// (netlink.TickInUsec()).
//
// The bucket is raised to one full-size frame when the burst is smaller (a
// bucket that cannot hold a frame drops every full-size packet) and cut to
// the kernel's maximum of about 4.29 s of traffic when it is longer (the
// kernel would cut it anyway; the reference overflows a 32-bit tick count
// instead and gets an arbitrary bucket).
func tbfFor(l Limit, mtu int, tickInUsec float64) tbfParams {
	rate := l.Rate / 8
	if rate == 0 {
		rate = 1
	}
	bucket := l.Burst / 8
	if mtu <= 0 {
		mtu = 1500
	}
	if minBucket := uint64(mtu + ethHeader); bucket < minBucket {
		bucket = minBucket
	}
	usec := float64(bucket) * 1e6 / float64(rate)
	if usec > maxBucketUsec {
		usec = maxBucketUsec
		bucket = uint64(usec * float64(rate) / 1e6)
	}
	room := uint64(queueFrames * (mtu + ethHeader))
	if whole := min(bucket, maxGSOPacket); whole > room {
		room = whole
	}
	limit := float64(rate)*queueLatencyUsec/1e6 + float64(room)
	if limit > float64(^uint32(0)) {
		limit = float64(^uint32(0))
	}
	return tbfParams{
		Rate:   rate,
		Buffer: uint32(usec * tickInUsec),
		Limit:  uint32(limit),
		Bucket: bucket,
	}
}

// ifbInfo is what meshwire records in an ifb device's alias: whose it is and
// what ADD did on the host end of the veth, so that DEL and GC can undo
// exactly that even when the pod's namespace is gone.
type ifbInfo struct {
	Net         string // attachment.NetworkTag of the network
	Dev         int    // ifindex of the host end of the veth
	OwnsIngress bool   // ADD created the ingress qdisc on Dev (else it was there)
	ContainerID string
	IfName      string
}

const aliasMagic = "meshwire-bandwidth"

// alias renders the info; the kernel keeps up to 255 bytes, and the
// container id, for people only, is cut to fit.
func (i ifbInfo) alias() string {
	own := "shared"
	if i.OwnsIngress {
		own = "own"
	}
	s := fmt.Sprintf("%s net=%s dev=%d ingress=%s if=%s id=%s", aliasMagic, i.Net, i.Dev, own, i.IfName, i.ContainerID)
	if len(s) > 255 {
		s = s[:255]
	}
	return s
}

// parseAlias reads an alias written by alias; ok is false for anything else.
func parseAlias(s string) (ifbInfo, bool) {
	fields := strings.Fields(s)
	if len(fields) == 0 || fields[0] != aliasMagic {
		return ifbInfo{}, false
	}
	var i ifbInfo
	for _, f := range fields[1:] {
		k, v, _ := strings.Cut(f, "=")
		switch k {
		case "net":
			i.Net = v
		case "dev":
			n, err := strconv.Atoi(v)
			if err != nil {
				return ifbInfo{}, false
			}
			i.Dev = n
		case "ingress":
			i.OwnsIngress = v == "own"
		case "if":
			i.IfName = v
		case "id":
			i.ContainerID = v
		}
	}
	if i.Net == "" {
		return ifbInfo{}, false
	}
	return i, true
}

// gcVictims returns the ifb devices GC removes: those of this network (by
// alias, in either form of its tag) whose name is not the ifb of a valid
// attachment (in either form of the name).
func gcVictims(network string, devices map[string]string, valid []attachment.ID) []string {
	keep := map[string]bool{}
	for _, a := range valid {
		a.Network = network
		for _, n := range a.IfbNames() {
			keep[n] = true
		}
	}
	tags := attachment.NetworkTags(network)
	var out []string
	for name, alias := range devices {
		if !strings.HasPrefix(name, attachment.IfbPrefix) || keep[name] {
			continue
		}
		if info, ok := parseAlias(alias); ok && slices.Contains(tags, info.Net) {
			out = append(out, name)
		}
	}
	return out
}
