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
	dir, err := testdata()
	if err != nil {
		t.Fatal(err)
	}
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

// TestStatusPortsGolden: istio-cni's status-ports golden, which no case
// of istio-cni's test names at this release, is its basic golden with one
// inbound exclusion more (port 22, before the status ports) once its
// older istio-iptables form is brought to today's. So the intercept
// plugin's rules for a pod excluding port 22 can be compared with it
// (TestIstioCNIGoldens), and the form is all that was changed.
func TestStatusPortsGolden(t *testing.T) {
	read := func(name string) string {
		b, err := File("cni/pkg/plugin/testdata/" + name + ".txt.golden")
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	basic, old := read("basic"), read("status-ports")
	const status = "-A ISTIO_INBOUND -p tcp --dport 15020 -j RETURN\n"
	want := strings.Replace(basic, status, "-A ISTIO_INBOUND -p tcp --dport 22 -j RETURN\n"+status, 1)
	if want == basic {
		t.Fatalf("basic golden has no line %q", status)
	}
	if got := CurrentCNIGolden(old); got != want {
		t.Errorf("status-ports golden in today's form is not the basic golden excluding port 22:\n--- got\n%s--- want\n%s", got, want)
	}
	if CurrentCNIGolden(basic) != basic {
		t.Errorf("CurrentCNIGolden changes the basic golden, which is in today's form")
	}
}
