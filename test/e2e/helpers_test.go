package e2e

import (
	"errors"
	"net"
	"time"

	"github.com/meshwire/meshwire/internal/probe"

	"github.com/containernetworking/cni/pkg/types"
)

func asCNIError(err error, target **types.Error) bool { return errors.As(err, target) }

func probePing(nsPath, ip string) (time.Duration, error) {
	return probe.Ping(nsPath, net.ParseIP(ip), 2*time.Second)
}
