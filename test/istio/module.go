// Package istio gives meshwire's tests Istio's own test data: the golden
// files of istio-iptables, istio-nftables and istio-cni's sidecar plugin,
// committed under testdata/ with their origin (testdata/ORIGIN.md) and
// refreshed from the istio.io/istio module by refresh-goldens.sh.
package istio

import (
	"os"
	"path/filepath"
	"runtime"
)

// Release is the Istio release whose test data testdata/ carries.
const Release = "1.30.3"

// testdata is the directory of the committed golden files, found from this
// source file so that any test package can read them.
func testdata() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "testdata")
}

// File reads one of Istio's golden files by its path in the istio
// repository.
func File(path string) ([]byte, error) {
	return os.ReadFile(filepath.Join(testdata(), filepath.FromSlash(path)))
}
