//go:build kernel

package agentsocket

import (
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/meshwire/meshwire/internal/kerneltest"
)

// envDial names the socket TestDialAsOther dials, in the copy of the test
// binary TestNonRootCannotConnect runs as another user.
const envDial = "MESHWIRE_TEST_AGENTSOCKET_DIAL"

// TestDialAsOther is the other user's side of TestNonRootCannotConnect:
// it dials the socket and says what happened. It does nothing in a run
// of the tests.
func TestDialAsOther(t *testing.T) {
	path := os.Getenv(envDial)
	if path == "" {
		return
	}
	c, err := net.Dial("unix", path)
	if err != nil {
		fmt.Printf("dial: %v\n", err)
		return
	}
	c.Close()
	fmt.Println("connected")
}

// TestNonRootCannotConnect: a process of another user (nobody) cannot
// connect to the agent's socket, even when the directory that holds it is
// opened to everyone (the socket's own mode, 0600, stops it), and root
// can.
func TestNonRootCannotConnect(t *testing.T) {
	kerneltest.Require(t)
	// A directory every user can reach, with a copy of this test binary
	// every user can run.
	dir, err := os.MkdirTemp("", "mwt-agentsocket-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "agentsocket.test")
	if err := copyFile(os.Args[0], bin); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "ambient", "agent.sock")
	ln, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go Serve(ctx, ln, func(context.Context, string) (string, error) { return AnswerEnrolled, nil })
	// Opened to everyone: only the socket's mode is left to say no.
	if err := os.Chmod(filepath.Dir(sock), 0o755); err != nil {
		t.Fatal(err)
	}
	dial := func(uid uint32) string {
		cmd := exec.Command(bin, "-test.run=^TestDialAsOther$", "-test.count=1")
		cmd.Env = append(os.Environ(), envDial+"="+sock)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uid, Gid: uid}}
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("run the dial as uid %d: %v\n%s", uid, err, out)
		}
		return string(out)
	}
	if out := dial(65534); !strings.Contains(out, "permission denied") {
		t.Fatalf("nobody dialing the agent's socket: %s; want permission denied", out)
	}
	if out := dial(0); !strings.Contains(out, "connected") {
		t.Fatalf("root dialing the agent's socket: %s", out)
	}
}

func copyFile(from, to string) error {
	in, err := os.Open(from)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
