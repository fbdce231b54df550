//go:build tools

// Package critest pins cri-tools, whose critest is a test binary
// (sigs.k8s.io/cri-tools/cmd/critest holds only cri_test.go): build.sh
// builds it with `go test -c`. These imports are what that test imports,
// so that go mod tidy keeps their dependencies. A module of its own:
// cri-tools' Kubernetes libraries are newer than those of ../go.mod.
package critest

import (
	_ "github.com/onsi/ginkgo/v2"
	_ "github.com/onsi/gomega"
	_ "sigs.k8s.io/cri-tools/pkg/benchmark"
	_ "sigs.k8s.io/cri-tools/pkg/common"
	_ "sigs.k8s.io/cri-tools/pkg/framework"
	_ "sigs.k8s.io/cri-tools/pkg/validate"
	_ "sigs.k8s.io/cri-tools/pkg/version"
)
