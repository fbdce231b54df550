//go:build kernel

package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/meshwire/meshwire/internal/probe"
	"github.com/meshwire/meshwire/test/harness"
)

const loopbackConf = `{"type":"loopback"}`

// TestLoopbackEveryVersion runs the full life cycle for each spec version the
// plugin serves and checks what the kernel shows after each step.
func TestLoopbackEveryVersion(t *testing.T) {
	for _, v := range version.All.SupportedVersions() {
		t.Run(v, func(t *testing.T) {
			h := harness.New(t)
			h.CheckNoLeaks()
			ns := h.NewNS("lo")
			if ns.IsUp("lo") {
				t.Fatal("a fresh namespace should have lo down")
			}
			list := h.Single(v, "lo-"+strings.ReplaceAll(v, ".", ""), loopbackConf)
			a := h.Attach(list, ns, "lo", nil)

			res, err := a.Add()
			if err != nil {
				t.Fatalf("ADD: %v", err)
			}
			if !ns.IsUp("lo") {
				t.Fatal("lo is down after ADD")
			}
			if addrs := ns.Addrs("lo"); !slices.Contains(addrs, "127.0.0.1/8") {
				t.Fatalf("lo addresses %v lack 127.0.0.1/8", addrs)
			}
			if _, err := probe.Ping(ns.Path, net.IPv4(127, 0, 0, 1), 2*time.Second); err != nil {
				t.Fatalf("lo does not answer ping after ADD: %v", err)
			}
			if res.Version() != v {
				t.Fatalf("result version %s, want %s", res.Version(), v)
			}
			cr, err := current.NewResultFromResult(res)
			if err != nil {
				t.Fatalf("convert result: %v", err)
			}
			if !hasIP(cr, "127.0.0.1/8") {
				t.Fatalf("result lacks 127.0.0.1/8: %+v", cr)
			}
			if gte(v, "0.3.0") {
				if len(cr.Interfaces) != 1 || cr.Interfaces[0].Name != "lo" || cr.Interfaces[0].Sandbox != ns.Path {
					t.Fatalf("result interfaces %+v, want lo in %s", cr.Interfaces, ns.Path)
				}
			}
			if gte(v, "0.4.0") {
				if err := a.Check(); err != nil {
					t.Fatalf("CHECK after ADD: %v", err)
				}
			}
			if gte(v, "1.1.0") {
				if err := h.Status(list); err != nil {
					t.Fatalf("STATUS: %v", err)
				}
				if err := h.GC(list, a.GCAttachment()); err != nil {
					t.Fatalf("GC: %v", err)
				}
				if !ns.IsUp("lo") {
					t.Fatal("GC touched a valid attachment: lo is down")
				}
			}
			if err := a.Del(); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			if ns.IsUp("lo") {
				t.Fatal("lo is still up after DEL")
			}
			if err := a.Del(); err != nil {
				t.Fatalf("second DEL: %v", err)
			}
		})
	}
}

// TestLoopbackCheckDetectsDown proves CHECK can fail.
func TestLoopbackCheckDetectsDown(t *testing.T) {
	h := harness.New(t)
	ns := h.NewNS("lo")
	a := h.Attach(h.Single("1.1.0", "lo-check", loopbackConf), ns, "lo", nil)
	a.MustAdd()
	if err := ns.Netlink().LinkSetDown(ns.Link("lo")); err != nil {
		t.Fatal(err)
	}
	err := a.Check()
	if err == nil || !strings.Contains(err.Error(), "lo is down") {
		t.Fatalf("CHECK with lo down: got %v, want an error saying lo is down", err)
	}
}

// TestLoopbackChained: when chained, ADD passes prevResult through unchanged.
func TestLoopbackChained(t *testing.T) {
	h := harness.New(t)
	ns := h.NewNS("lo")
	list := h.ConfList(`{"cniVersion":"1.0.0","name":"lo-chain","plugins":[{"type":"loopback"},{"type":"loopback"}]}`)
	a := h.Attach(list, ns, "lo", nil)
	got := a.MustAdd()
	single := h.Attach(h.Single("1.0.0", "lo-single", loopbackConf), h.NewNS("lo"), "lo", nil)
	want := single.MustAdd()
	got.Interfaces[0].Sandbox, want.Interfaces[0].Sandbox = "", ""
	gj, _ := json.Marshal(got)
	wj, _ := json.Marshal(want)
	if string(gj) != string(wj) {
		t.Fatalf("chained result changed prevResult:\n got %s\nwant %s", gj, wj)
	}
	if err := a.Check(); err != nil {
		t.Fatalf("CHECK chained: %v", err)
	}
}

// TestLoopbackDelWithoutNetns: DEL succeeds with the namespace gone or not
// given at all, as runtimes do after a crash.
func TestLoopbackDelWithoutNetns(t *testing.T) {
	h := harness.New(t)
	list := h.Single("1.1.0", "lo-del", loopbackConf)
	for name, path := range map[string]string{
		"missing": "/run/netns/meshwire-does-not-exist",
		"empty":   "",
		"not-ns":  "/proc/self/status",
	} {
		t.Run(name, func(t *testing.T) {
			a := h.Attach(list, &harness.NS{Path: path}, "lo", nil)
			if err := a.Del(); err != nil {
				t.Fatalf("DEL with netns %q: %v", path, err)
			}
		})
	}
	t.Run("deleted-after-add", func(t *testing.T) {
		ns := h.NewNS("lo")
		a := h.Attach(list, ns, "lo", nil)
		a.MustAdd()
		if out, err := harness.Run("ip", "netns", "del", ns.Name); err != nil {
			t.Fatalf("ip netns del: %v: %s", err, out)
		}
		if err := a.Del(); err != nil {
			t.Fatalf("DEL after the namespace was deleted: %v", err)
		}
	})
}

// TestLoopbackIgnoresIfName: like the reference, the plugin works on lo
// whatever CNI_IFNAME names. With CNI_IFNAME=eth0 and a real eth0 in the
// namespace (a veth peer), ADD brings lo up and names lo in its result, CHECK
// passes, and DEL takes lo down and leaves eth0 up.
func TestLoopbackIgnoresIfName(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	ns := h.NewNS("lo")
	peer := "mwtlo" + harness.RandomID()[:8]
	if out, err := ns.Exec("ip", "link", "add", "eth0", "type", "veth", "peer", "name", peer); err != nil {
		t.Fatalf("add veth: %v: %s", err, out)
	}
	if out, err := ns.Exec("ip", "link", "set", "eth0", "up"); err != nil {
		t.Fatalf("set eth0 up: %v: %s", err, out)
	}
	// A DEL on its own, as a runtime sends after a failed ADD.
	if err := h.Attach(h.Single("1.1.0", "lo-eth0", loopbackConf), ns, "eth0", nil).Del(); err != nil {
		t.Fatalf("DEL with CNI_IFNAME=eth0: %v", err)
	}
	if !ns.IsUp("eth0") {
		t.Fatal("DEL with CNI_IFNAME=eth0 took the pod's eth0 down")
	}
	for _, v := range []string{"0.4.0", "1.1.0"} {
		t.Run(v, func(t *testing.T) {
			a := h.Attach(h.Single(v, "lo-eth0", loopbackConf), ns, "eth0", nil)
			r, err := a.Add()
			if err != nil {
				t.Fatalf("ADD with CNI_IFNAME=eth0: %v", err)
			}
			res, err := current.NewResultFromResult(r)
			if err != nil {
				t.Fatalf("convert result: %v", err)
			}
			if !ns.IsUp("lo") {
				t.Fatal("lo is down after ADD with CNI_IFNAME=eth0")
			}
			if len(res.Interfaces) != 1 || res.Interfaces[0].Name != "lo" || !hasIP(res, "127.0.0.1/8") {
				t.Fatalf("result %+v, want lo with 127.0.0.1/8", res)
			}
			if err := a.Check(); err != nil {
				t.Fatalf("CHECK with CNI_IFNAME=eth0: %v", err)
			}
			if err := a.Del(); err != nil {
				t.Fatalf("DEL with CNI_IFNAME=eth0: %v", err)
			}
			if !ns.IsUp("eth0") {
				t.Fatal("DEL with CNI_IFNAME=eth0 took the pod's eth0 down")
			}
			if ns.IsUp("lo") {
				t.Fatal("lo is still up after DEL")
			}
		})
	}
	// An interface that does not exist changes nothing either.
	a := h.Attach(h.Single("1.1.0", "lo-eth7", loopbackConf), ns, "eth7", nil)
	a.MustAdd()
	if !ns.IsUp("lo") {
		t.Fatal("lo is down after ADD with CNI_IFNAME=eth7")
	}
}

// TestLoopbackBadInput runs the binary the way a broken runtime would and
// checks the error object, the exit code and that nothing changed.
func TestLoopbackBadInput(t *testing.T) {
	h := harness.New(t)
	h.CheckNoLeaks()
	ns := h.NewNS("lo")
	env := func(cmd string) map[string]string {
		e := map[string]string{"CNI_CONTAINERID": "c1", "CNI_NETNS": ns.Path, "CNI_IFNAME": "lo", "CNI_PATH": h.BinDir}
		if cmd != "" {
			e["CNI_COMMAND"] = cmd
		}
		return e
	}
	good := `{"cniVersion":"1.1.0","name":"n","type":"loopback"}`
	cases := []struct {
		name  string
		cmd   string
		stdin string
		code  uint
		msg   string
	}{
		{"empty stdin", "ADD", "", 6, ""},
		{"invalid json", "ADD", `{"cniVersion":`, 6, ""},
		{"not an object", "ADD", `[1,2]`, 6, ""},
		{"wrong type", "ADD", `{"cniVersion":"1.1.0","name":"n","type":"bridge"}`, 7, "type"},
		{"type not a string", "ADD", `{"cniVersion":"1.1.0","name":"n","type":5}`, 7, "type"},
		{"missing command", "", good, 4, "CNI_COMMAND"},
		{"unknown command", "FROB", good, 4, "FROB"},
		{"missing name", "ADD", `{"cniVersion":"1.1.0","type":"loopback"}`, 7, "name"},
		{"bad log file", "ADD", `{"cniVersion":"1.1.0","name":"n","type":"loopback","log":{"file":"relative.log"}}`, 7, "log.file"},
		{"bad log level", "ADD", `{"cniVersion":"1.1.0","name":"n","type":"loopback","log":{"file":"/tmp/x.log","level":"loud"}}`, 7, "log.level"},
		{"bad prevResult", "ADD", `{"cniVersion":"1.1.0","name":"n","type":"loopback","prevResult":{"ips":[{"address":"nonsense"}]}}`, 7, "prevResult"},
		{"unsupported version", "ADD", `{"cniVersion":"9.9.9","name":"n","type":"loopback"}`, 1, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h.Exec("loopback", env(c.cmd), []byte(c.stdin)).WantCNIError(t, c.code, c.msg)
			if ns.IsUp("lo") {
				t.Fatal("a failed ADD brought lo up")
			}
		})
	}
}

func TestLoopbackVersion(t *testing.T) {
	h := harness.New(t)
	got, err := h.Version("loopback")
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		if !slices.Contains(got, v) {
			t.Fatalf("VERSION %v lacks %s", got, v)
		}
	}
	r := h.Exec("loopback", map[string]string{"CNI_COMMAND": "VERSION"}, nil)
	var info struct{ Implementation string }
	if err := json.Unmarshal(r.Stdout, &info); err != nil || !strings.HasPrefix(info.Implementation, "meshwire loopback ") {
		t.Fatalf("VERSION output %q does not name meshwire and its version (%v)", r.Stdout, err)
	}
}

// TestLoopbackLog: the log object writes JSON lines to the file, never to
// stdout (libcni would fail to parse the result otherwise).
func TestLoopbackLog(t *testing.T) {
	h := harness.New(t)
	ns := h.NewNS("lo")
	logFile := filepath.Join(t.TempDir(), "sub", "cni.log")
	conf := fmt.Sprintf(`{"type":"loopback","log":{"file":%q,"level":"debug"}}`, logFile)
	a := h.Attach(h.Single("1.1.0", "lo-log", conf), ns, "lo", nil)
	a.MustAdd()
	if err := a.Del(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatalf("log file: %v", err)
	}
	var seen []string
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		seen = append(seen, fmt.Sprintf("%v/%v", rec["command"], rec["msg"]))
		if rec["containerID"] != a.RT.ContainerID {
			t.Fatalf("log record without the container id: %v", rec)
		}
	}
	for _, want := range []string{"ADD/start", "ADD/done", "DEL/done"} {
		if !slices.Contains(seen, want) {
			t.Fatalf("log %v lacks %s", seen, want)
		}
	}
}

func hasIP(r *current.Result, cidr string) bool {
	for _, ip := range r.IPs {
		if ip.Address.String() == cidr {
			return true
		}
	}
	return false
}

func gte(v, min string) bool {
	ok, _ := version.GreaterThanOrEqualTo(v, min)
	return ok
}

func assertCNIError(t *testing.T, err error, code uint, mention string) {
	t.Helper()
	var e *types.Error
	if err == nil {
		t.Fatalf("got success, want CNI error %d mentioning %q", code, mention)
	}
	if !asCNIError(err, &e) || e.Code != code || !strings.Contains(e.Msg, mention) {
		t.Fatalf("got %v, want CNI error %d mentioning %q", err, code, mention)
	}
}
