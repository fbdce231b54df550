//go:build cluster

package clustersuites

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/meshwire/meshwire/internal/hostlocal/store"
	"github.com/meshwire/meshwire/test/clustersuites/framework"
)

const runtimeGCNS = "mwk-runtime-gc"

// runtimeGCMinAge is the --min-age of the suite's GC: short, so that the
// suite waits little for an attachment to be old.
const runtimeGCMinAge = 20 * time.Second

// TestRuntimeGC (one node, containerd 2, meshwire): containerd v2.4.2
// calls the plugins' STATUS but not their GC, so a node agent's `meshwire
// gc --cri-socket` runs it against the sandboxes containerd lists over
// CRI. Pods whose networks containerd set up run (echo, a client that
// reaches it); an attachment whose DEL was lost is made as a runtime makes
// one, through libcni with the node's conflist, plugins and cache, with a
// container id containerd does not know, in a network namespace of its
// own; once it is older than --min-age, a second one is made the same
// way just before the GC (an ADD that the runtime would list only once it
// is done). After the GC: the lost attachment's address is free in
// host-local's store, its host veth and its cached result are gone; the
// young one keeps its address, veth and cache entry; the pods keep theirs
// and the client still reaches echo.
//
// RUNTIME_GC_BREAK=min-age-0 runs the GC with --min-age 0, which keeps
// nothing for its age: the young attachment's checks must fail.
func TestRuntimeGC(t *testing.T) {
	c := framework.Load(t)
	ctx := context.Background()
	framework.Require(t, "the cluster's network is meshwire", checkCNI(c, "meshwire"))
	if c.Runtime != "containerd2" || len(c.Nodes) != 1 {
		t.Fatalf("the runtime GC suite needs one node on containerd 2 (make cluster RUNTIME=containerd2), this cluster is %d node(s) on %q", len(c.Nodes), c.Runtime)
	}
	minAge := runtimeGCMinAge
	switch b := os.Getenv("RUNTIME_GC_BREAK"); b {
	case "":
	case "min-age-0":
		minAge = 0
		t.Logf("deliberate break %s: the GC runs with --min-age 0", b)
	default:
		t.Fatalf("RUNTIME_GC_BREAK: min-age-0 or nothing, not %q", b)
	}
	node := c.Nodes[0]
	fresh(t, ctx, c, runtimeGCNS)
	apply(t, ctx, c, "runtime-gc.yaml", nil)
	t.Cleanup(func() { _ = c.DeleteNamespace(ctx, runtimeGCNS, 2*time.Minute) })
	_, err := c.WaitReady(ctx, runtimeGCNS, "", 2, 2*time.Minute)
	framework.Require(t, "pods echo and client Ready", err)

	// The pods as containerd lists them.
	sbs, err := node.Sandboxes(ctx, runtimeGCNS)
	framework.Require(t, "the pods' sandboxes over CRI", err)
	pods := map[string]framework.Sandbox{}
	for _, sb := range sbs {
		pods[sb.Pod] = sb
	}
	echo := pods["echo"]
	framework.Require(t, "echo's sandbox and address", checkf(echo.ID != "" && echo.IP != "", "sandboxes %+v", sbs))
	rt := newNodeRuntime(t, c, node)
	echoVeth, err := rt.hostVeth(echo.ID)
	framework.Require(t, "echo's host veth, from its cached result", err)
	reach := func() error {
		reply, err := get(ctx, c, runtimeGCNS, "client", "client", "http://"+echo.IP+":8080/hostname")
		return answers(reply, err, "echo")
	}
	framework.Require(t, "client -> echo "+echo.IP, reach())

	// The lost attachment: ADD as a runtime, never DELed, unknown to
	// containerd.
	lost := rt.add("lost")
	t.Logf("lost attachment %s: %s on %s (netns %s)", lost.id[:12], lost.ip, lost.veth, lost.netns)
	wait := time.Until(lost.made.Add(runtimeGCMinAge + 2*time.Second))
	t.Logf("waiting %s for it to be older than --min-age %s", wait.Round(time.Second), runtimeGCMinAge)
	time.Sleep(wait)
	// The young one: an ADD just done, not in the runtime's list.
	young := rt.add("young")
	t.Logf("young attachment %s: %s on %s", young.id[:12], young.ip, young.veth)
	framework.Require(t, "both attachments in the stores before the GC", errors.Join(rt.holds(lost, true), rt.holds(young, true)))

	out, err := node.Command(filepath.Join(c.Repo, "bin", "meshwire"), "gc",
		"--cri-socket", node.CRISocket, "--min-age", minAge.String(),
		"--cni-conf-dir", rt.confDir, "--cni-cache-dir", node.VarLibCNI, "--cni-path", rt.binDir).CombinedOutput()
	t.Logf("meshwire gc --cri-socket %s --min-age %s:\n%s", node.CRISocket, minAge, out)
	framework.Require(t, "meshwire gc --cri-socket", err)

	framework.Check(t, "the lost attachment is collected: its address free in host-local's store, its host veth and cached result gone", rt.holds(lost, false))
	framework.Check(t, "the young attachment (not listed, younger than --min-age) survives: address, host veth, cached result", rt.holds(young, true))
	framework.Check(t, "echo's attachment survives: address, host veth, cached result", rt.holds(attachmentOf(echo.ID, echo.IP, echoVeth), true))
	framework.Check(t, "the client still reaches echo "+echo.IP, reach())
	sbs, err = node.Sandboxes(ctx, runtimeGCNS)
	framework.Check(t, "containerd's sandboxes unchanged", errors.Join(err, checkf(len(sbs) == 2, "%+v", sbs)))
}

// gcAttachment is an attachment on the node: its container id, address,
// host veth, and when its ADD ended.
type gcAttachment struct {
	id, ip, veth, netns string
	made                time.Time
}

func attachmentOf(id, ip, veth string) gcAttachment { return gcAttachment{id: id, ip: ip, veth: veth} }

// nodeRuntime adds attachments as a runtime does, through libcni with the
// node's conflist, plugins and cache (one node: the host's paths).
type nodeRuntime struct {
	t                      *testing.T
	cni                    *libcni.CNIConfig
	list                   *libcni.NetworkConfigList
	confDir, binDir, cache string
	store                  string
}

func newNodeRuntime(t *testing.T, c *framework.Cluster, n framework.Node) *nodeRuntime {
	r := &nodeRuntime{t: t, confDir: filepath.Join(c.State, "cni", "net.d"), binDir: filepath.Join(c.State, "cni", "bin"), cache: n.VarLibCNI}
	files, err := libcni.ConfFiles(r.confDir, []string{".conflist"})
	framework.Require(t, "the node's conflist", errors.Join(err, checkf(len(files) > 0, "none in %s", r.confDir)))
	r.list, err = libcni.NetworkConfFromFile(files[0])
	framework.Require(t, "the node's conflist "+files[0], err)
	r.cni = libcni.NewCNIConfigWithCacheDir([]string{r.binDir}, r.cache, nil)
	r.store = filepath.Join(n.VarLibCNI, "networks", r.list.Name, store.DBName)
	return r
}

// add is an ADD of a new container id into a network namespace of its
// own, which t's cleanup DELs and removes (whatever the GC did).
func (r *nodeRuntime) add(name string) gcAttachment {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	a := gcAttachment{id: hex.EncodeToString(b), netns: "mwk-gc-" + name}
	out, err := framework.Node{}.Command("ip", "netns", "add", a.netns).CombinedOutput()
	framework.Require(r.t, "network namespace "+a.netns, errors.Join(err, checkf(err == nil, "%s", out)))
	rc := &libcni.RuntimeConf{ContainerID: a.id, NetNS: "/run/netns/" + a.netns, IfName: "eth0"}
	r.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		_ = r.cni.DelNetworkList(ctx, r.list, rc)
		_ = framework.Node{}.Command("ip", "netns", "del", a.netns).Run()
	})
	_, err = r.cni.AddNetworkList(context.Background(), r.list, rc)
	framework.Require(r.t, "ADD of the "+name+" attachment through "+r.list.Name, err)
	a.made = time.Now()
	a.ip, a.veth, err = r.result(a.id)
	framework.Require(r.t, "the "+name+" attachment's result", err)
	return a
}

// cached is the path of id's cached result.
func (r *nodeRuntime) cached(id string) string {
	return filepath.Join(r.cache, "results", r.list.Name+"-"+id+"-eth0")
}

// result reads id's address and host veth from its cached result.
func (r *nodeRuntime) result(id string) (ip, veth string, err error) {
	b, err := os.ReadFile(r.cached(id))
	if err != nil {
		return "", "", err
	}
	var c struct {
		Result struct {
			Interfaces []struct {
				Name    string `json:"name"`
				Sandbox string `json:"sandbox"`
			} `json:"interfaces"`
			IPs []struct {
				Address string `json:"address"`
			} `json:"ips"`
		} `json:"result"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return "", "", err
	}
	// The host's interfaces: the bridge (a directory bridge/ in sysfs)
	// and the pod's host veth.
	for _, i := range c.Result.Interfaces {
		if _, err := os.Stat("/sys/class/net/" + i.Name + "/bridge"); i.Sandbox == "" && i.Name != "" && err != nil {
			veth = i.Name
		}
	}
	if len(c.Result.IPs) > 0 {
		ip, _, _ = strings.Cut(c.Result.IPs[0].Address, "/")
	}
	if ip == "" || veth == "" {
		return ip, veth, fmt.Errorf("no address or host veth in %s", b)
	}
	return ip, veth, nil
}

func (r *nodeRuntime) hostVeth(id string) (string, error) {
	_, veth, err := r.result(id)
	return veth, err
}

// holds checks a's address (held by a's id in host-local's store, free
// when !want), its host veth and its cached result, against want.
func (r *nodeRuntime) holds(a gcAttachment, want bool) error {
	allocs, err := store.ReadAll(r.store, 10*time.Second)
	if err != nil {
		return err
	}
	owner := ""
	for _, al := range allocs {
		if al.IP.String() == a.ip {
			owner = al.Owner.ID
		}
	}
	_, vethErr := os.Stat("/sys/class/net/" + a.veth)
	_, cacheErr := os.Stat(r.cached(a.id))
	var errs []error
	if want {
		errs = append(errs, checkf(owner == a.id, "address %s held by %q, want %s", a.ip, owner, a.id[:12]),
			checkf(vethErr == nil, "host veth %s: %v", a.veth, vethErr), checkf(cacheErr == nil, "cached result: %v", cacheErr))
	} else {
		errs = append(errs, checkf(owner == "", "address %s still held by %q", a.ip, owner),
			checkf(vethErr != nil, "host veth %s still there", a.veth), checkf(cacheErr != nil, "cached result %s still there", r.cached(a.id)))
	}
	return errors.Join(errs...)
}
