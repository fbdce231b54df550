//go:build kernel

package e2e

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/meshwire/meshwire/internal/crigc/crigctest"
	"github.com/meshwire/meshwire/internal/hostlocal/store"
	"github.com/meshwire/meshwire/test/harness"
)

// TestMeshwireGCCRISocket: `meshwire gc --cri-socket` with the real
// plugins (bridge with masquerade, host-local, portmap, bandwidth at
// cniVersion 1.1.0) and a CRI runtime that lists one sandbox: of three
// attachments made as a runtime makes them (libcni, the runtime's cache),
// the listed one and one made less than --min-age before the listing stay
// (pod interface, host veth, masquerade, address, cached result), the old
// one the runtime does not list is collected (its cached DEL: the pair
// gone from both ends, its masquerade and address released). With
// --min-age 0 the young one goes too.
func TestMeshwireGCCRISocket(t *testing.T) {
	m := newMeshwireCmd(t)
	h := harness.New(t)
	nodeBaseline(t)
	h.CheckNoLeaks()
	conf := meshwireConflist(t)
	list := h.ConfList(mustRead(t, conf))
	dataDir := filepath.Join(filepath.Dir(conf), "ipam")
	type att struct {
		a    *harness.Attachment
		ip   string
		veth string
	}
	add := func() att {
		a := h.Attach(list, h.NewNS("gc"), "eth0", nil)
		r := a.MustAdd()
		x := att{a: a}
		for _, i := range r.Interfaces {
			if i.Sandbox == "" && i.Name != meshwireTestBridge {
				x.veth = i.Name
			}
		}
		for _, ip := range r.IPs {
			if ip.Address.IP.To4() != nil {
				x.ip = ip.Address.IP.String()
			}
		}
		if x.veth == "" || x.ip == "" {
			t.Fatalf("no host veth or IPv4 address in %+v", r)
		}
		return x
	}
	listed, lost := add(), add()
	const minAge = 3 * time.Second
	time.Sleep(minAge + time.Second)
	young := add()

	cri := &crigctest.Runtime{IDs: []string{listed.a.RT.ContainerID}}
	sock := crigctest.Serve(t, cri)

	held := func() map[string]string {
		as, err := store.ReadAll(filepath.Join(store.Dir(dataDir, "mwt-cmd"), store.DBName), 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, a := range as {
			out[a.IP.String()] = a.Owner.ID
		}
		return out
	}
	stays := func(what string, x att, want bool) {
		t.Helper()
		_, vethErr := netlink.LinkByName(x.veth)
		_, cacheErr := h.CNI.GetNetworkListCachedResult(list, x.a.RT)
		cached, _ := h.CNI.GetNetworkListCachedResult(list, x.a.RT)
		got := map[string]bool{
			"pod interface": x.a.NS.HasLink("eth0"),
			"host veth":     vethErr == nil,
			"masquerade":    bridgeMasqInstalled(t, "mwt-cmd", x.a),
			"address":       held()[x.ip] == x.a.RT.ContainerID,
			"cached result": cacheErr == nil && cached != nil,
		}
		var wrong []string
		for k, v := range got {
			if v != want {
				wrong = append(wrong, k)
			}
		}
		sort.Strings(wrong)
		if len(wrong) > 0 {
			verb := "kept"
			if want {
				verb = "lost"
			}
			t.Errorf("%s: %s %s", what, verb, strings.Join(wrong, ", "))
		}
	}
	gc := func(minAge string) string {
		return m.mustRun("gc", "--cri-socket", sock, "--min-age", minAge, "--cni-conf-dir", filepath.Dir(conf),
			"--cni-cache-dir", h.CacheDir, "--node-state-dir", t.TempDir())
	}
	out := gc(minAge.String())
	t.Logf("meshwire gc --cri-socket:\n%s", out)
	if !strings.Contains(out, "1 stale cached attachments deleted ("+lost.a.RT.ContainerID[:12]+" eth0)") {
		t.Errorf("the report does not name the lost attachment's DEL:\n%s", out)
	}
	stays("the listed attachment", listed, true)
	stays("the young attachment (not listed, younger than --min-age)", young, true)
	stays("the lost attachment (not listed, older than --min-age)", lost, false)

	// The deliberate break: --min-age 0 keeps nothing for its age.
	gc("0s")
	stays("the listed attachment, with --min-age 0", listed, true)
	stays("the young attachment, with --min-age 0", young, false)
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
