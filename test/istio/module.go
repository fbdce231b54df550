// Package istio gives meshwire's tests Istio's own test data: the golden
// files of istio-iptables, istio-nftables and istio-cni's sidecar plugin,
// read from the istio.io/istio module as the Go module proxy serves it.
// They are not copied into this repository: the test downloads the
// module (once per machine, into the Go module cache) at the version
// pinned here, checked against its go.sum hash.
package istio

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
)

// Version is the istio.io/istio module version the goldens come from: a
// master commit of 2026-08-27 (eed52ebb66ad), the newest the Go module
// proxy serves. Its tools/istio-iptables/pkg/capture/testdata,
// tools/istio-nftables/pkg/capture/testdata and cni/pkg/plugin/testdata
// are byte for byte those of the 1.30.3 release, the newest Istio release
// (checked with diff against the 1.30.3 tag); Istio's release tags are not
// module versions, so the proxy has none of them.
const (
	Version = "v0.0.0-20260827124520-eed52ebb66ad"
	Sum     = "h1:ui9TJjRMAV/hb5ehQaZDq7IUGxuQP6dra9lapT/VjHI="
	// Release is the Istio release whose test data Version carries.
	Release = "1.30.3"
)

var (
	once   sync.Once
	dir    string
	dirErr error
)

// Dir returns the directory of the istio.io/istio module at Version,
// downloading it through the Go module proxy when it is not in the module
// cache yet.
func Dir() (string, error) {
	once.Do(func() { dir, dirErr = download() })
	return dir, dirErr
}

func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

func download() (string, error) {
	tmp, err := os.MkdirTemp("", "meshwire-istio-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.Command(goTool(), "mod", "download", "-json", "istio.io/istio@"+Version)
	// Outside any module, so that meshwire's go.mod is not touched.
	cmd.Dir = tmp
	cmd.Env = append(os.Environ(), "GO111MODULE=on", "GOFLAGS=-mod=mod")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	runErr := cmd.Run()
	var m struct{ Dir, Sum, Error string }
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		return "", fmt.Errorf("go mod download istio.io/istio@%s: %v: %s%s", Version, runErr, out.String(), errb.String())
	}
	if m.Error != "" {
		return "", fmt.Errorf("go mod download istio.io/istio@%s: %s", Version, m.Error)
	}
	if m.Sum != Sum {
		return "", fmt.Errorf("istio.io/istio@%s has hash %s, want %s", Version, m.Sum, Sum)
	}
	return m.Dir, nil
}

// File reads a file of the module, by its path in the istio repository.
func File(path string) ([]byte, error) {
	d, err := Dir()
	if err != nil {
		return nil, err
	}
	return os.ReadFile(filepath.Join(d, filepath.FromSlash(path)))
}
