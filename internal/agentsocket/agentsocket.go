// Package agentsocket is the intercept plugin's line to the node agent
// when the agent's ambient mode is on: a Unix socket, root's alone. At a
// Kubernetes pod's ADD the plugin asks the agent to act on the pod before
// the ADD returns (Ask), naming the pod's record (package podstate); the
// agent answers on the socket it listens on (Listen, Serve). Whoever
// writes on the socket makes the agent act on a pod's network namespace.
package agentsocket

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/meshwire/meshwire/internal/nodelayout"
	"github.com/meshwire/meshwire/internal/podstate"
)

// Answers of the agent to Ask.
const (
	AnswerEnrolled    = "enrolled"
	AnswerNotEnrolled = "not enrolled"
)

// ErrNoAgent: no agent listens on the socket (its ambient mode is off, or
// it is not running).
var ErrNoAgent = errors.New("no node agent answers on its socket")

// AskTimeout bounds one question: the agent installs the pod's rules and
// waits for ztunnel's ack within it.
const AskTimeout = 20 * time.Second

// Ask asks the agent at socket to act on the pod whose record is named
// name, and returns its answer: AnswerEnrolled, AnswerNotEnrolled with
// why, or the agent's error.
func Ask(ctx context.Context, socket, name string) (string, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return "", fmt.Errorf("%w (%s): %v", ErrNoAgent, socket, err)
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

// Listen listens at path, in place of a socket a previous agent left,
// with mode nodelayout.SocketMode (its directory nodelayout.DirMode).
//
// The socket file stays when the listener closes: while the agent is away
// (a rollout), the plugin still sees that ambient mode is on, records
// each new pod and is told no agent answers; the agent enrolls those pods
// from their records when it is back. An agent whose ambient mode is off
// removes it.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), nodelayout.DirMode); err != nil {
		return nil, err
	}
	if err := os.Chmod(filepath.Dir(path), nodelayout.DirMode); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	// The umask covers the window between bind and chmod.
	old := unix.Umask(0o777 &^ int(nodelayout.SocketMode))
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	unix.Umask(old)
	if err != nil {
		return nil, err
	}
	ln.SetUnlinkOnClose(false)
	if err := os.Chmod(path, nodelayout.SocketMode); err != nil {
		ln.Close()
		return nil, err
	}
	return ln, nil
}

// Serve answers Ask on ln until ctx ends: answer is called for each
// question, a record's name (refused unless it is one path element,
// podstate.ValidName), and returns the answer's line or an error.
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
			name := strings.TrimSuffix(line, "\n")
			a, err := "", podstate.ValidName(name)
			if err == nil {
				a, err = answer(ctx, name)
			} else {
				slog.Warn("refused a question on the agent's socket", "error", err)
			}
			if err != nil {
				a = "error: " + strings.ReplaceAll(err.Error(), "\n", "; ")
			}
			fmt.Fprintf(c, "%s\n", a)
		}()
	}
}
