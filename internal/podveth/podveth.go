// Package podveth is what the veth-based interface plugins (bridge, veth)
// share. It holds their common config keys (config.go), the attachment they make
// (attachment.go), the steps of ADD in the order both run them (add.go),
// DEL (del.go), CHECK (check.go), STATUS and GC (status.go), and the
// timing and error joining of steps that run side by side (steps.go).
//
// Namespace handles come from internal/netns, the pair itself from
// internal/link, IPAM calls from internal/ipamexec and masquerading from
// internal/ipmasq; this package only puts them in order.
package podveth

import (
	"github.com/meshwire/meshwire/internal/announce"
	"github.com/meshwire/meshwire/internal/detach"
	"github.com/meshwire/meshwire/internal/link"
)

// Jobs are the detached jobs of the veth-based plugins; their main calls
// detach.Run(podveth.Jobs) first.
var Jobs = map[string]detach.Job{
	announce.JobName:   announce.Job,
	link.DeleteJobName: link.DeleteJob,
}
