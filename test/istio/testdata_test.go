package istio

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGoldensAsCopied holds the committed golden files to SHA256SUMS,
// written by refresh-goldens.sh when it copied them from the istio.io/istio
// module, and makes sure every file is listed: Istio's test data is
// compared with, never edited.
func TestGoldensAsCopied(t *testing.T) {
	dir := testdata()
	f, err := os.Open(filepath.Join(dir, "SHA256SUMS"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	listed := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("SHA256SUMS: malformed line %q", sc.Text())
		}
		listed[name] = true
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Error(err)
			continue
		}
		if got := sha256.Sum256(data); hex.EncodeToString(got[:]) != sum {
			t.Errorf("%s differs from the copy refresh-goldens.sh made", name)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for _, top := range []string{"tools", "cni"} {
		err := filepath.WalkDir(filepath.Join(dir, top), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(dir, path)
			if !listed[rel] {
				t.Errorf("%s is not in SHA256SUMS", rel)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if len(listed) != 27+28+9+14+14 {
		t.Errorf("SHA256SUMS lists %d files, want the 92 golden files of istio %s", len(listed), Release)
	}
}
