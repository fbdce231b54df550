package nftnl

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestOnlyTheFirewallImportsNftnl: the codec is internal/firewall's (the
// front door and its netlink half, fwnetlink); every other package goes
// through firewall.Interface.
func TestOnlyTheFirewallImportsNftnl(t *testing.T) {
	const self = "github.com/meshwire/meshwire/internal/nftnl"
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); p != root && (strings.HasPrefix(n, ".") || n == "testdata" || n == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") {
			return nil
		}
		dir := filepath.ToSlash(filepath.Dir(p))
		if strings.HasSuffix(dir, "internal/firewall") || strings.HasSuffix(dir, "internal/firewall/fwnetlink") || strings.HasSuffix(dir, "internal/nftnl") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.ImportsOnly)
		if err != nil {
			return nil // not ours to judge
		}
		for _, im := range f.Imports {
			if path, _ := strconv.Unquote(im.Path.Value); path == self {
				t.Errorf("%s imports internal/nftnl: use internal/firewall", p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
