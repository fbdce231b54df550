// Package ipamexec delegates addressing to the IPAM plugin named in a
// config's "ipam.type", found on CNI_PATH, for every CNI command, keeping
// the IPAM plugin's error codes and naming it in the messages.
//
// It runs the plugin as libcni's delegation does (the caller's environment
// with CNI_COMMAND set, the config on stdin, a CNI error read from stdout),
// without linking libcni's invoke package, whose tracing brings an HTTP
// stack into every plugin binary and a millisecond to every start. An IPAM
// plugin compiled into the caller runs in-process when the binary found is
// the one built with it (see Linked).
package ipamexec

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/types/create"

	"github.com/meshwire/meshwire/internal/cnierr"
)

// Timeout bounds one IPAM call.
const Timeout = 60 * time.Second

// find returns the path of plugin typ on CNI_PATH.
func find(typ string) (string, error) {
	if typ == "" || strings.ContainsRune(typ, os.PathSeparator) {
		return "", fmt.Errorf("invalid plugin name %q", typ)
	}
	paths := filepath.SplitList(os.Getenv("CNI_PATH"))
	for _, dir := range paths {
		p := filepath.Join(dir, typ)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("failed to find plugin %q in path %s", typ, paths)
}

// run executes IPAM command cmd of plugin typ with stdin as its config and
// returns its stdout; a failure is the plugin's own CNI error when it wrote
// one.
func run(ctx context.Context, typ, cmd string, stdin []byte) ([]byte, error) {
	path, err := find(typ)
	if err != nil {
		return nil, err
	}
	if l := linkedFor(typ, path); l != nil {
		return l.run(cmd, stdin)
	}
	env := os.Environ()
	for i := 0; i < len(env); i++ {
		if strings.HasPrefix(env[i], "CNI_COMMAND=") {
			env = append(env[:i], env[i+1:]...)
			i--
		}
	}
	env = append(env, "CNI_COMMAND="+cmd)
	var stdout, stderr bytes.Buffer
	for attempt := 0; ; attempt++ {
		stdout.Reset()
		stderr.Reset()
		c := exec.CommandContext(ctx, path)
		// Dies with this plugin when the runtime kills it, so that no
		// reservation is made after the DEL that follows.
		c.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		c.Env = env
		c.Stdin = bytes.NewReader(stdin)
		c.Stdout, c.Stderr = &stdout, &stderr
		err = c.Run()
		// A plugin binary being replaced on the node is busy for a moment.
		if err != nil && errors.Is(err, syscall.ETXTBSY) && attempt < 5 {
			time.Sleep(time.Second)
			continue
		}
		break
	}
	if err == nil {
		return stdout.Bytes(), nil
	}
	e := &types.Error{}
	switch {
	case stdout.Len() > 0 && json.Unmarshal(stdout.Bytes(), e) == nil && (e.Code != 0 || e.Msg != ""):
	case stderr.Len() > 0:
		e = &types.Error{Code: types.ErrInternal, Msg: fmt.Sprintf("failed: %q", strings.TrimSpace(stderr.String()))}
	case stdout.Len() > 0:
		e = &types.Error{Code: types.ErrInternal, Msg: fmt.Sprintf("failed (%v) with a message that is not a CNI error: %q", err, strings.TrimSpace(stdout.String()))}
	default:
		e = &types.Error{Code: types.ErrInternal, Msg: fmt.Sprintf("failed with no error message: %v", err)}
	}
	return nil, e
}

func wrap(typ, cmd string, err error) error {
	if err == nil {
		return nil
	}
	return cnierr.Wrap(err, "ipam %q %s", typ, cmd)
}

// Add runs IPAM ADD and converts the result to the current spec version. It
// also returns release, which runs IPAM DEL: the caller's rollback when a
// later step of its ADD fails.
func Add(ctx context.Context, typ string, stdin []byte) (*current.Result, func(), error) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	out, err := run(ctx, typ, "ADD", stdin)
	if err != nil {
		return nil, nil, wrap(typ, "ADD", err)
	}
	var conf types.PluginConf
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return nil, nil, cnierr.Internal("ipam %q ADD: %v", typ, err)
	}
	release := func() {
		if err := Del(context.Background(), typ, stdin); err != nil {
			slog.Warn("rollback: IPAM DEL failed", "ipam", typ, "error", err)
		}
	}
	if conf.CNIVersion == "" {
		conf.CNIVersion = "0.1.0" // what a config without a version means
	}
	var res *current.Result
	ver, out, err := resultVersion(conf.CNIVersion, out)
	if err == nil {
		var r types.Result
		if r, err = create.Create(ver, out); err == nil {
			res, err = current.NewResultFromResult(r)
		}
	}
	if err != nil {
		release()
		return nil, nil, cnierr.Internal("ipam %q ADD: cannot convert its result: %v", typ, err)
	}
	if len(res.IPs) == 0 {
		release()
		return nil, nil, cnierr.Internal("ipam %q ADD returned no IP address", typ)
	}
	return res, release, nil
}

// call runs one IPAM command without result, bounded by Timeout, and
// names the plugin and command in its error.
func call(ctx context.Context, typ, cmd string, stdin []byte) error {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	_, err := run(ctx, typ, cmd, stdin)
	return wrap(typ, cmd, err)
}

// Del runs IPAM DEL.
func Del(ctx context.Context, typ string, stdin []byte) error {
	return call(ctx, typ, "DEL", stdin)
}

// Check runs IPAM CHECK.
func Check(ctx context.Context, typ string, stdin []byte) error {
	return call(ctx, typ, "CHECK", stdin)
}

// Status runs IPAM STATUS. An IPAM plugin that cannot be found makes the
// network not available (code 50).
func Status(ctx context.Context, typ string, stdin []byte) error {
	if _, err := find(typ); err != nil {
		return cnierr.NotAvailable("ipam plugin %q not found on CNI_PATH: %v", typ, err)
	}
	return call(ctx, typ, "STATUS", stdin)
}

// GC runs IPAM GC (the config carries cni.dev/valid-attachments).
func GC(ctx context.Context, typ string, stdin []byte) error {
	return call(ctx, typ, "GC", stdin)
}

// Pending is an IPAM ADD running in the background while the caller builds
// the links (the two do not depend on each other).
type Pending struct {
	done    chan struct{}
	res     *current.Result
	release func()
	err     error
}

// Start runs IPAM ADD in the background.
func Start(ctx context.Context, typ string, stdin []byte) *Pending {
	p := &Pending{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		p.err = cnierr.Catch(func() (err error) {
			p.res, p.release, err = Add(ctx, typ, stdin)
			return err
		})
	}()
	return p
}

// Wait returns the IPAM result.
func (p *Pending) Wait() (*current.Result, error) {
	<-p.done
	return p.res, p.err
}

// Release waits for the ADD and undoes it when it succeeded.
func (p *Pending) Release() {
	<-p.done
	if p.release != nil {
		p.release()
		p.release = nil
	}
}

// resultVersion returns the spec version of an IPAM result and the result,
// as libcni reads a delegated plugin's: its own cniVersion, or, when it has
// none (many script and custom IPAM plugins leave it out), the config's,
// written into it.
func resultVersion(confVersion string, out []byte) (string, []byte, error) {
	var raw map[string]any
	if err := json.Unmarshal(out, &raw); err != nil {
		return "", nil, fmt.Errorf("not a JSON object: %v", err)
	}
	if v, ok := raw["cniVersion"].(string); ok && v != "" {
		return v, out, nil
	}
	raw["cniVersion"] = confVersion
	fixed, err := json.Marshal(raw)
	return confVersion, fixed, err
}
