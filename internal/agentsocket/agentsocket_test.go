package agentsocket

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// serve listens at a socket of the test's and answers with answer.
func serve(t *testing.T, answer func(context.Context, string) (string, error)) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "ambient", "agent.sock")
	ln, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go Serve(ctx, ln, answer)
	return sock
}

func ask(t *testing.T, sock, name string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return Ask(ctx, sock, name)
}

// TestAskServe: the plugin's question reaches the agent's answer, an
// error comes back as one (its lines joined), and no agent is ErrNoAgent.
func TestAskServe(t *testing.T) {
	if _, err := ask(t, filepath.Join(t.TempDir(), "none.sock"), "x"); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("no agent: %v", err)
	}
	sock := serve(t, func(_ context.Context, name string) (string, error) {
		if name == "bad" {
			return "", errors.New("no ztunnel\nconnected")
		}
		return AnswerEnrolled + " " + name, nil
	})
	if a, err := ask(t, sock, "c1-eth0"); err != nil || a != "enrolled c1-eth0" {
		t.Fatalf("answer %q, %v", a, err)
	}
	if _, err := ask(t, sock, "bad"); err == nil || !strings.Contains(err.Error(), "no ztunnel; connected") {
		t.Fatalf("error answer: %v", err)
	}
}

// TestNameWithSeparatorRefused: a question naming anything but one path
// element (a name that would lead the agent out of the records'
// directory) is refused before the agent reads anything.
func TestNameWithSeparatorRefused(t *testing.T) {
	var asked []string
	sock := serve(t, func(_ context.Context, name string) (string, error) {
		asked = append(asked, name)
		return AnswerEnrolled, nil
	})
	for _, name := range []string{"../../../etc/passwd", "a/b", "..", ".tmp-c1-eth0-1", ""} {
		if a, err := ask(t, sock, name); err == nil || !strings.Contains(err.Error(), "one path element") {
			t.Errorf("question %q: answered %q, %v; want it refused", name, a, err)
		}
	}
	if len(asked) != 0 {
		t.Fatalf("the agent was asked %q", asked)
	}
}

// TestSocketIsRootsAlone: the socket and its directory have modes that
// let only their owner in, whatever the umask.
func TestSocketIsRootsAlone(t *testing.T) {
	sock := serve(t, func(context.Context, string) (string, error) { return "", nil })
	for path, want := range map[string]os.FileMode{sock: 0o600, filepath.Dir(sock): 0o700} {
		st, err := os.Stat(path)
		if err != nil || st.Mode().Perm() != want {
			t.Fatalf("%s: mode %v (%v), want %v", path, st.Mode().Perm(), err, want)
		}
	}
}
