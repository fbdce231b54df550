package hostlocal

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/meshwire/meshwire/internal/hostlocal/config"
	"github.com/meshwire/meshwire/internal/hostlocal/store"
)

func loadConf(t *testing.T, dataDir, ipam string, extra ...string) *config.IPAM {
	t.Helper()
	s := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"mwt-hl-unit","type":"bridge","ipam":%s`, strings.Replace(ipam, "{", fmt.Sprintf(`{"dataDir":%q,`, dataDir), 1))
	for _, e := range extra {
		s += "," + e
	}
	c, err := config.Load([]byte(s+"}"), "")
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return c
}

// add runs allocate in its own transaction, as Add does.
func add(t *testing.T, c *config.IPAM, id string) ([]*current.IPConfig, error) {
	t.Helper()
	s, err := store.Open(c.DataDir, c.Network, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out []*current.IPConfig
	err = s.Update(func(tx *store.Tx) error {
		out, err = allocate(tx, c, store.Owner{ID: id, IfName: "eth0"})
		return err
	})
	return out, err
}

func addrs(ips []*current.IPConfig) string {
	var s []string
	for _, c := range ips {
		s = append(s, c.Address.String()+" gw "+c.Gateway.String())
	}
	return strings.Join(s, ", ")
}

func TestAllocateRoundRobinDualStack(t *testing.T) {
	c := loadConf(t, t.TempDir(), `{"ranges":[[{"subnet":"198.18.0.0/29"}],[{"subnet":"fd10:0:0:2::/125","gateway":"fd10:0:0:2::7"}]]}`)
	want := []string{
		"198.18.0.2/29 gw 198.18.0.1, fd10:0:0:2::1/125 gw fd10:0:0:2::7",
		"198.18.0.3/29 gw 198.18.0.1, fd10:0:0:2::2/125 gw fd10:0:0:2::7",
	}
	for i, w := range want {
		got, err := add(t, c, fmt.Sprintf("c%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if addrs(got) != w {
			t.Fatalf("ADD %d: %s, want %s", i, addrs(got), w)
		}
	}
	// Release c0: round-robin goes on after .3 instead of reusing .2.
	s, _ := store.Open(c.DataDir, c.Network, time.Second)
	_ = s.Update(func(tx *store.Tx) error { _, err := tx.ReleaseOwner(store.Owner{ID: "c0", IfName: "eth0"}); return err })
	s.Close()
	got, err := add(t, c, "c2")
	if err != nil || !strings.HasPrefix(addrs(got), "198.18.0.4/29") {
		t.Fatalf("ADD after a release: %s %v, want 198.18.0.4", addrs(got), err)
	}
}

func TestAllocateErrors(t *testing.T) {
	dir := t.TempDir()
	small := loadConf(t, dir, `{"subnet":"198.18.0.0/30"}`) // one address: .2
	if _, err := add(t, small, "a"); err != nil {
		t.Fatal(err)
	}
	_, err := add(t, small, "a")
	assertErr(t, err, 999, "second ADD")
	_, err = add(t, small, "b")
	assertErr(t, err, 999, "no free address left in range set 0 (198.18.0.1-198.18.0.2)")

	dual := loadConf(t, t.TempDir(), `{"ranges":[[{"subnet":"198.18.1.0/24"}],[{"subnet":"198.18.2.0/30"}]]}`)
	if _, err := add(t, dual, "x"); err != nil {
		t.Fatal(err)
	}
	// The second set is full: the first set's address must not stay taken.
	_, err = add(t, dual, "y")
	assertErr(t, err, 999, "range set 1")
	assertHolds(t, dual, "y", 0)

	req := func(extra string) *config.IPAM {
		return loadConf(t, dual.DataDir, `{"ranges":[[{"subnet":"198.18.1.0/24"}],[{"subnet":"198.18.2.0/30"}]]}`, extra)
	}
	_, err = add(t, req(`"runtimeConfig":{"ips":["198.18.1.2"]}`), "z")
	assertErr(t, err, 999, "198.18.1.2 is already allocated to container x interface eth0")
	_, err = add(t, req(`"runtimeConfig":{"ips":["198.18.1.1"]}`), "z")
	assertErr(t, err, 7, "gateway")
	_, err = add(t, req(`"runtimeConfig":{"ips":["198.18.9.9"]}`), "z")
	assertErr(t, err, 7, "198.18.9.9 is in none of the range sets")
	_, err = add(t, req(`"runtimeConfig":{"ips":["198.18.1.10","198.18.1.11"]}`), "z")
	assertErr(t, err, 7, "fall in the same range set 0")
	assertHolds(t, dual, "z", 0)
}

func TestAllocateRequested(t *testing.T) {
	c := loadConf(t, t.TempDir(), `{"ranges":[[{"subnet":"198.18.0.0/24"}],[{"subnet":"fd10::/64"}]]}`, `"runtimeConfig":{"ips":["fd10::99","198.18.0.77/24"]}`)
	got, err := add(t, c, "r")
	if err != nil {
		t.Fatal(err)
	}
	if addrs(got) != "198.18.0.77/24 gw 198.18.0.1, fd10::99/64 gw fd10::1" {
		t.Fatalf("got %s", addrs(got))
	}
	// Round-robin continues after the requested address.
	c2 := loadConf(t, c.DataDir, `{"ranges":[[{"subnet":"198.18.0.0/24"}],[{"subnet":"fd10::/64"}]]}`)
	got, err = add(t, c2, "s")
	if err != nil || !strings.HasPrefix(addrs(got), "198.18.0.78/24") {
		t.Fatalf("got %s %v", addrs(got), err)
	}
}

func assertErr(t *testing.T, err error, code uint, msg string) {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) || e.Code != code || !strings.Contains(e.Msg, msg) {
		t.Fatalf("got %v, want code %d mentioning %q", err, code, msg)
	}
}

func assertHolds(t *testing.T, c *config.IPAM, id string, n int) {
	t.Helper()
	s, err := store.Open(c.DataDir, c.Network, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_ = s.View(func(tx *store.Tx) error {
		held, _ := tx.ByOwner(store.Owner{ID: id, IfName: "eth0"})
		if len(held) != n {
			t.Fatalf("%s holds %v, want %d addresses", id, held, n)
		}
		return nil
	})
}

func TestVerify(t *testing.T) {
	c := loadConf(t, t.TempDir(), `{"subnet":"198.18.0.0/24"}`)
	o := store.Owner{ID: "c", IfName: "eth0"}
	held := []store.Allocation{{IP: net.ParseIP("198.18.0.5").To4(), Owner: o}}
	prev := func(addrs ...string) *current.Result {
		r := &current.Result{}
		for _, a := range addrs {
			ipn, _ := types.ParseCIDR(a)
			r.IPs = append(r.IPs, &current.IPConfig{Address: *ipn})
		}
		return r
	}
	cases := []struct {
		name string
		held []store.Allocation
		prev *current.Result
		msg  string
	}{
		{"held, no prevResult", held, nil, ""},
		{"held and in prevResult", held, prev("198.18.0.5/24"), ""},
		{"prevResult address of another IPAM is ignored", held, prev("198.18.0.5/24", "198.18.9.1/24"), ""},
		{"nothing held", nil, nil, "holds no address"},
		{"prevResult address not held", held, prev("198.18.0.6/24"), "198.18.0.6 of prevResult"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := verify(c, o, tc.held, tc.prev)
			if tc.msg == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			assertErr(t, err, 999, tc.msg)
		})
	}
}

func TestCollectAndReadiness(t *testing.T) {
	c := loadConf(t, t.TempDir(), `{"subnet":"198.18.0.0/29"}`)
	for _, id := range []string{"keep", "drop1", "drop2"} {
		if _, err := add(t, c, id); err != nil {
			t.Fatal(err)
		}
	}
	s, _ := store.Open(c.DataDir, c.Network, time.Second)
	defer s.Close()
	_ = s.Update(func(tx *store.Tx) error {
		// an id-only reference-style owner is kept while its container is valid
		_ = tx.Reserve(store.Allocation{IP: net.ParseIP("198.18.0.6").To4(), Owner: store.Owner{ID: "keep"}})
		_ = tx.Reserve(store.Allocation{IP: net.ParseIP("198.18.0.5").To4(), Owner: store.Owner{ID: "gone"}})
		stale, err := collect(tx, []types.GCAttachment{{ContainerID: "keep", IfName: "eth0"}, {ContainerID: "drop1", IfName: "eth1"}}, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, a := range stale {
			got = append(got, a.Owner.ID)
		}
		if strings.Join(got, ",") != "drop1,drop2,gone" {
			t.Fatalf("GC would release %v, want drop1,drop2,gone", got)
		}
		// .2 .3 .4 .5 .6 are all taken: the /29 is full.
		if err := readiness(c, tx.Taken); err == nil {
			t.Fatal("STATUS ready with a full range")
		} else {
			assertErr(t, err, 50, "no free address")
		}
		for _, a := range stale {
			_ = tx.Release(a)
		}
		return readiness(c, tx.Taken)
	})
}

func TestParseResolvConf(t *testing.T) {
	p := filepath.Join(t.TempDir(), "resolv.conf")
	_ = os.WriteFile(p, []byte("# c\n; c\nnameserver 198.18.0.53\nnameserver fd10::53\ndomain example.test\nsearch a.test b.test\noptions ndots:2 edns0\nbogus\n"), 0o644)
	d, err := parseResolvConf(p)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(d.Nameservers, " ") != "198.18.0.53 fd10::53" || d.Domain != "example.test" || strings.Join(d.Search, " ") != "a.test b.test" || strings.Join(d.Options, " ") != "ndots:2 edns0" {
		t.Fatalf("parsed %+v", d)
	}
	if _, err := parseResolvConf(p + ".missing"); err == nil {
		t.Fatal("a missing resolv.conf parsed")
	}
}

func TestValidAttachments(t *testing.T) {
	cases := []struct {
		stdin string
		want  int
		code  uint
	}{
		{`{"cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"},{"containerID":"b","ifname":"eth0"}]}`, 2, 0},
		{`{"cni.dev/attachments":[{"containerID":"a","ifname":"eth0"}]}`, 1, 0},
		{`{"cni.dev/valid-attachments":[],"cni.dev/attachments":[{"containerID":"a","ifname":"eth0"}]}`, 0, 0},
		{`{"cni.dev/valid-attachments":null}`, 0, 0}, // libcni's "keep nothing"
		{`{"name":"n"}`, 0, 7},
		{`{"cni.dev/valid-attachments":{"containerID":"a"}}`, 0, 7},
		{`[1]`, 0, 6},
	}
	for _, c := range cases {
		got, err := validAttachments([]byte(c.stdin))
		if c.code != 0 {
			var e *types.Error
			if !errors.As(err, &e) || e.Code != c.code {
				t.Errorf("%s: got %v, want code %d", c.stdin, err, c.code)
			}
			continue
		}
		if err != nil || len(got) != c.want {
			t.Errorf("%s: got %v %v, want %d attachments", c.stdin, got, err, c.want)
		}
	}
}

// With meshwire's cutoff (GCAllocatedBefore), GC releases only what was
// allocated before it: an allocation made after, not in the valid list,
// is an ADD still under way; one of unknown time counts as before.
func TestCollectCutoff(t *testing.T) {
	c := loadConf(t, t.TempDir(), `{"subnet":"198.18.0.0/28"}`)
	s, err := store.Open(c.DataDir, c.Network, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cutoff := time.Now().Add(-time.Minute)
	_ = s.Update(func(tx *store.Tx) error {
		for i, a := range []store.Allocation{
			{Owner: store.Owner{ID: "old", IfName: "eth0"}, Since: cutoff.Add(-time.Second)},
			{Owner: store.Owner{ID: "young", IfName: "eth0"}, Since: cutoff.Add(time.Second)},
			{Owner: store.Owner{ID: "listed", IfName: "eth0"}, Since: cutoff.Add(-time.Hour)},
		} {
			a.IP = net.IPv4(198, 18, 0, byte(2+i)).To4()
			if err := tx.Reserve(a); err != nil {
				t.Fatal(err)
			}
		}
		return nil
	})
	_ = s.View(func(tx *store.Tx) error {
		valid := []types.GCAttachment{{ContainerID: "listed", IfName: "eth0"}}
		for _, tc := range []struct {
			cutoff time.Time
			want   string
		}{{cutoff, "old"}, {time.Time{}, "old,young"}} {
			stale, err := collect(tx, valid, tc.cutoff)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, a := range stale {
				got = append(got, a.Owner.ID)
			}
			if strings.Join(got, ",") != tc.want {
				t.Errorf("cutoff %v: GC would release %v, want %s", tc.cutoff, got, tc.want)
			}
		}
		return nil
	})
	for _, tc := range []struct {
		conf string
		want time.Time
		bad  bool
	}{
		{`{}`, time.Time{}, false},
		{`{"meshwire.dev/gc-allocated-before":null}`, time.Time{}, false},
		{`{"meshwire.dev/gc-allocated-before":"2026-11-29T10:00:00.5Z"}`, time.Date(2026, 11, 29, 10, 0, 0, 5e8, time.UTC), false},
		{`{"meshwire.dev/gc-allocated-before":"2m"}`, time.Time{}, true},
	} {
		got, err := gcCutoff([]byte(tc.conf))
		if tc.bad {
			assertErr(t, err, 7, GCAllocatedBefore)
			continue
		}
		if err != nil || !got.Equal(tc.want) {
			t.Errorf("%s: %v, %v; want %v", tc.conf, got, err, tc.want)
		}
	}
}
