package e2e

import (
	"errors"

	"github.com/containernetworking/cni/pkg/types"
)

func asCNIError(err error, target **types.Error) bool { return errors.As(err, target) }
