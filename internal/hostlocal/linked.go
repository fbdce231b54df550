package hostlocal

import "github.com/meshwire/meshwire/internal/ipamexec"

// Linked is host-local as an IPAM plugin compiled into another plugin's
// binary. The bridge and veth plugins' main registers it with
// ipamexec.Link, so that their IPAM calls run in-process when the
// host-local found on CNI_PATH is the binary built together with them
// (BuildID), saving a process start on every ADD, DEL and CHECK.
func Linked() ipamexec.Linked {
	return ipamexec.Linked{
		Type: Type, BuildID: BuildID,
		Add: Add, Del: Del, Check: Check, GC: GC, Status: Status,
	}
}
