// Package istio gives meshwire's tests Istio's own test data: the golden
// files of istio-iptables, istio-nftables and istio-cni's sidecar plugin,
// committed under testdata/ with their origin (testdata/ORIGIN.md) and
// refreshed from the istio.io/istio module by refresh-goldens.sh.
package istio

import (
	"os"
	"path/filepath"

	"github.com/meshwire/meshwire/test/harness"
)

// Release is the Istio release whose test data testdata/ carries.
const Release = "1.30.3"

// testdata is the directory of the committed golden files, found from the
// repository's root so that any test package can read them (make test
// builds with -trimpath: a source file's own path names no directory).
func testdata() (string, error) {
	root, err := harness.RepoRoot()
	return filepath.Join(root, "test", "istio", "testdata"), err
}

// File reads one of Istio's golden files by its path in the istio
// repository.
func File(path string) ([]byte, error) {
	dir, err := testdata()
	if err != nil {
		return nil, err
	}
	return os.ReadFile(filepath.Join(dir, filepath.FromSlash(path)))
}
