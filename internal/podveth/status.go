package podveth

import (
	"context"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/meshwire/meshwire/internal/attachment"
	"github.com/meshwire/meshwire/internal/cnierr"
	"github.com/meshwire/meshwire/internal/firewall"
	"github.com/meshwire/meshwire/internal/ipamexec"
	"github.com/meshwire/meshwire/internal/ipmasq"
	"github.com/meshwire/meshwire/internal/refrules"
)

// Status is STATUS: the firewall backend must be usable when ipMasq is on,
// and IPAM must be ready.
func (a *Attachment) Status(ctx context.Context) error {
	if a.IPMasq {
		b, err := firewall.Resolve(ctx, a.Backend)
		if err != nil {
			return err
		}
		if err := ipmasq.Available(ctx, b); err != nil {
			return err
		}
	}
	if a.IPAMType != "" {
		return ipamexec.Status(ctx, a.IPAMType, a.Args.StdinData)
	}
	return nil
}

// GC removes the masquerade rules of the network's attachments that are not
// in valid, runs extra (the plugin's own) and delegates GC to IPAM.
func (a *Attachment) GC(ctx context.Context, valid []types.GCAttachment, extra func([]attachment.ID) error) error {
	var keep []attachment.ID
	for _, v := range valid {
		keep = append(keep, attachment.ID{Network: a.Network, ContainerID: v.ContainerID, IfName: v.IfName})
	}
	var errs []error
	if a.IPMasq {
		fw, err := firewall.NewHost(ctx, a.Backend)
		if err == nil {
			err = ipmasq.GC(ctx, fw, a.Network, keep)
		} else {
			fw = firewall.New(firewall.Backend{}) // the reference's forms need none
		}
		errs = append(errs, cnierr.Wrap(err, "ipMasq GC"))
		errs = append(errs, cnierr.Wrap(refrules.GCMasq(ctx, fw, a.Network, valid), "the reference's ipMasq GC"))
		fw.Close()
	}
	if extra != nil {
		errs = append(errs, extra(keep))
	}
	if a.IPAMType != "" {
		errs = append(errs, ipamexec.GC(ctx, a.IPAMType, a.Args.StdinData))
	}
	return joinErrors(errs...)
}
