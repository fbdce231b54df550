// Package podnetns tells the node agent where each Kubernetes pod's
// network namespace is. The intercept plugin, chained after the interface
// plugin, writes a record at every Kubernetes pod's ADD (the namespace path
// and identity, the pod's names, uid and addresses, its Istio annotations)
// and removes it at DEL; then it asks the agent, over a Unix socket, to
// act on the pod before the ADD returns (Ask). The agent reads the records
// to enroll pods in Istio's ambient mode: it needs the namespace to
// install the in-pod rules and to hand it to ztunnel, which the API server
// does not know.
package podnetns

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/meshwire/meshwire/internal/netns"
	"github.com/meshwire/meshwire/internal/recordfile"
)

// Dir is where the records are kept, under the directory the node agent's
// DaemonSet mounts.
const Dir = "/var/lib/cni/meshwire/pods"

// Socket is where the node agent answers the plugin's questions when its
// ambient mode is on (none: it is off).
const Socket = "/var/lib/cni/meshwire/ambient/agent.sock"

// Pod is one pod's attachment, as the runtime's ADD told it.
type Pod struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Netns       string `json:"netns"`
	NetnsIno    uint64 `json:"netnsIno"`
	NetnsDev    uint64 `json:"netnsDev"`

	UID       string       `json:"uid,omitempty"` // K8S_POD_UID
	Namespace string       `json:"namespace"`
	Name      string       `json:"name"`
	IPs       []netip.Addr `json:"ips,omitempty"` // the interface plugin's result
	// Annotations are the pod's annotations of Istio (keys with
	// "istio.io/" in them) that the runtime passed: the rest can be
	// large (kubectl's last-applied configuration) and is not read.
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Record is the record's file name: one per attachment, as DEL names it.
func (p Pod) Record() string { return recordfile.Name(p.ContainerID, p.IfName) }

// Key names the pod in logs and in the agent's state: namespace/name.
func (p Pod) Key() string { return p.Namespace + "/" + p.Name }

// IstioAnnotations keeps the annotations a Pod record holds.
func IstioAnnotations(all map[string]string) map[string]string {
	var out map[string]string
	for k, v := range all {
		if strings.Contains(k, "istio.io/") {
			if out == nil {
				out = map[string]string{}
			}
			out[k] = v
		}
	}
	return out
}

// Check tells whether p's namespace path still leads to the namespace
// recorded at ADD (netns.ErrNotThePod when not).
func (p Pod) Check() error { return netns.CheckIdentity(p.Netns, p.NetnsIno, p.NetnsDev) }

// Open opens p's namespace, once it is checked to be the pod's: what the
// agent hands to ztunnel.
func (p Pod) Open() (*os.File, error) {
	f, err := os.Open(p.Netns)
	if err != nil {
		return nil, fmt.Errorf("open the namespace of pod %s: %w", p.Key(), err)
	}
	// Checked after the open, so that the file is the namespace checked.
	if err := netns.CheckIdentity(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), p.NetnsIno, p.NetnsDev); err != nil {
		f.Close()
		return nil, fmt.Errorf("pod %s: %w", p.Key(), err)
	}
	return f, nil
}

const what = "the pod's namespace record"

func dirOf(dir string) string {
	if dir == "" {
		return Dir
	}
	return dir
}

// Write keeps p under dir (Dir when empty), identifying its namespace.
func Write(dir string, p Pod) error {
	var err error
	if p.NetnsIno, p.NetnsDev, err = netns.Identify(p.Netns); err != nil {
		return fmt.Errorf("identify the pod's namespace: %w", err)
	}
	return recordfile.Write(dirOf(dir), p.Record(), what, p)
}

// Remove removes the record of container id on ifName; none is not an
// error.
func Remove(dir, id, ifName string) error {
	return recordfile.Remove(dirOf(dir), recordfile.Name(id, ifName), what)
}

// Read returns the record named name (Pod.Record), or ok false when there
// is none.
func Read(dir, name string) (p Pod, ok bool, err error) {
	if name == "" || strings.ContainsAny(name, "/\x00") || strings.HasPrefix(name, ".") {
		return Pod{}, false, fmt.Errorf("%q names no record", name)
	}
	b, err := os.ReadFile(filepath.Join(dirOf(dir), name))
	if errors.Is(err, os.ErrNotExist) {
		return Pod{}, false, nil
	}
	if err == nil {
		err = json.Unmarshal(b, &p)
	}
	if err != nil {
		return Pod{}, false, fmt.Errorf("read %s %s: %w", what, name, err)
	}
	return p, true, nil
}

// List returns every record under dir, by name. Files that are not
// records (a write in progress, or cut short: its DEL removes it) are
// left out.
func List(dir string) (map[string]Pod, error) {
	recs, _, err := recordfile.ReadAll[Pod](dirOf(dir), "the pods' namespace records")
	return recs, err
}

// Answers of the agent to Ask.
const (
	AnswerEnrolled    = "enrolled"
	AnswerNotEnrolled = "not enrolled"
)

// ErrNoAgent: no agent listens on the socket (its ambient mode is off, or
// it is not running).
var ErrNoAgent = errors.New("no node agent answers on " + Socket)

// Ask asks the agent at socket (Socket when empty) to act on the pod whose
// record is named name, and returns its answer: AnswerEnrolled,
// AnswerNotEnrolled with why, or the agent's error.
func Ask(ctx context.Context, socket, name string) (string, error) {
	if socket == "" {
		socket = Socket
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNoAgent, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := fmt.Fprintf(c, "%s\n", name); err != nil {
		return "", fmt.Errorf("ask the node agent: %w", err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("the node agent's answer: %w", err)
	}
	line = strings.TrimSuffix(line, "\n")
	if msg, ok := strings.CutPrefix(line, "error: "); ok {
		return "", errors.New(msg)
	}
	return line, nil
}

// Serve answers Ask on ln until ctx ends: answer is called for each
// question (one record name) and returns the answer's line or an error.
func Serve(ctx context.Context, ln net.Listener, answer func(ctx context.Context, name string) (string, error)) {
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
			continue
		}
		go func() {
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(AskTimeout))
			line, err := bufio.NewReader(c).ReadString('\n')
			if err != nil {
				return
			}
			a, err := answer(ctx, strings.TrimSuffix(line, "\n"))
			if err != nil {
				a = "error: " + strings.ReplaceAll(err.Error(), "\n", "; ")
			}
			fmt.Fprintf(c, "%s\n", a)
		}()
	}
}

// AskTimeout bounds one question: the agent installs the pod's rules and
// waits for ztunnel's ack within it.
const AskTimeout = 20 * time.Second
