package zds

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/meshwire/meshwire/internal/poll"
)

// pods is a snapshot source the tests change as they go.
type pods struct {
	mu sync.Mutex
	ws []Workload
}

func (p *pods) set(ws ...Workload) { p.mu.Lock(); p.ws = ws; p.mu.Unlock() }
func (p *pods) get() []Workload {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Workload(nil), p.ws...)
}

// ownNetns opens the test process's own network namespace: a real netns
// file descriptor without root.
func ownNetns() (*os.File, error) { return os.Open("/proc/self/ns/net") }

func workload(uid string) Workload {
	return Workload{UID: uid, Name: "name-" + uid, Namespace: "ns", ServiceAccount: "sa", Netns: ownNetns}
}

// start runs a server on a socket in a temporary directory.
func start(t *testing.T, p *pods) (*Server, string) {
	t.Helper()
	return startTimeout(t, p, 300*time.Millisecond)
}

func startTimeout(t *testing.T, p *pods, timeout time.Duration) (*Server, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ztunnel", "ztunnel.sock")
	s, err := Listen(path, p.get)
	if err != nil {
		t.Fatal(err)
	}
	s.timeout = timeout
	served := make(chan error, 1)
	go func() { served <- s.Serve(context.Background()) }()
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return s, path
}

// event is what the recording ztunnel got.
type event struct {
	kind, uid string
	info      *WorkloadInfo
	ino       uint64 // the netns's inode, for add
}

// recorder is a Handler that reports every message and answers with
// fail's error for the uids it names.
type recorder struct {
	events chan event
	fail   map[string]string
}

func newRecorder() *recorder {
	return &recorder{events: make(chan event, 64), fail: map[string]string{}}
}

func (r *recorder) Add(uid string, info *WorkloadInfo, netns *os.File) error {
	defer netns.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(netns.Fd()), &st); err != nil {
		return err
	}
	r.events <- event{kind: "add", uid: uid, info: info, ino: st.Ino}
	return r.err(uid)
}
func (r *recorder) Keep(uid string) error {
	r.events <- event{kind: "keep", uid: uid}
	return r.err(uid)
}
func (r *recorder) Del(uid string) error { r.events <- event{kind: "del", uid: uid}; return r.err(uid) }
func (r *recorder) SnapshotSent() error  { r.events <- event{kind: "snapshot"}; return nil }
func (r *recorder) err(uid string) error {
	if e := r.fail[uid]; e != "" {
		return errors.New(e)
	}
	return nil
}

// connect runs a Client with r until the test ends.
func connect(t *testing.T, path string, r *recorder) *Client {
	t.Helper()
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Serve(context.Background(), r) }()
	t.Cleanup(func() {
		c.Close()
		if err := <-done; err != nil {
			t.Errorf("client: %v", err)
		}
	})
	return c
}

func (r *recorder) next(t *testing.T) event {
	t.Helper()
	select {
	case e := <-r.events:
		return e
	case <-time.After(5 * time.Second):
		t.Fatal("no message from the server")
	}
	return event{}
}

// expect reads the next events and compares their kind and uid.
func (r *recorder) expect(t *testing.T, want ...string) []event {
	t.Helper()
	var got []event
	for _, w := range want {
		e := r.next(t)
		if s := strings.TrimSpace(e.kind + " " + e.uid); s != w {
			t.Fatalf("got %q, want %q", s, w)
		}
		got = append(got, e)
	}
	return got
}

func netnsIno(t *testing.T) uint64 {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := poll.Until(5*time.Second, cond); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

func TestSocketFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ztunnel.sock")
	if err := os.WriteFile(path, nil, 0o644); err != nil { // a stale file
		t.Fatal(err)
	}
	s, err := Listen(path, func() []Workload { return nil })
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Type() != os.ModeSocket || st.Mode().Perm() != 0o600 {
		t.Errorf("socket file mode %v, want a socket with 0600", st.Mode())
	}
	s.Close()
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket file left after Close: %v", err)
	}
}

// TestHandoff: the snapshot, then adds and deletes, reach ztunnel with
// the workload's info and a descriptor of the very netns.
func TestHandoff(t *testing.T) {
	p := &pods{}
	p.set(workload("a"), workload("b"))
	s, path := start(t, p)
	r := newRecorder()
	connect(t, path, r)
	evs := r.expect(t, "add a", "add b", "snapshot")
	ino := netnsIno(t)
	for _, e := range evs[:2] {
		if e.ino != ino {
			t.Errorf("%s: netns inode %d, want %d", e.uid, e.ino, ino)
		}
		if e.info.GetName() != "name-"+e.uid || e.info.GetNamespace() != "ns" || e.info.GetServiceAccount() != "sa" {
			t.Errorf("%s: workload info %v", e.uid, e.info)
		}
	}
	waitFor(t, "connected", func() bool { return s.Stats().Connected == 1 })

	ctx := context.Background()
	p.set(workload("a"), workload("b"), workload("c"))
	if err := s.Add(ctx, workload("c")); err != nil {
		t.Fatal(err)
	}
	if e := r.expect(t, "add c")[0]; e.ino != ino {
		t.Errorf("c: netns inode %d, want %d", e.ino, ino)
	}
	if err := s.Del(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	r.expect(t, "del a")
	if got := s.Stats(); got != (Stats{Connected: 1, Handoffs: 3}) {
		t.Errorf("stats %+v", got)
	}
}

// TestNetnsClosed: the server closes every netns descriptor it opened.
func TestNetnsClosed(t *testing.T) {
	var mu sync.Mutex
	var opened []*os.File
	w := workload("a")
	w.Netns = func() (*os.File, error) {
		f, err := ownNetns()
		mu.Lock()
		opened = append(opened, f)
		mu.Unlock()
		return f, err
	}
	p := &pods{}
	p.set(w)
	s, path := start(t, p)
	r := newRecorder()
	connect(t, path, r)
	r.expect(t, "add a", "snapshot")
	if err := s.Add(context.Background(), w); err != nil {
		t.Fatal(err)
	}
	r.expect(t, "add a")
	mu.Lock()
	defer mu.Unlock()
	if len(opened) != 2 {
		t.Fatalf("%d netns opened, want 2", len(opened))
	}
	for _, f := range opened {
		if f.Fd() != ^uintptr(0) {
			t.Errorf("netns descriptor %d left open", f.Fd())
		}
	}
}

// TestSnapshotOnReconnect: each connection gets the snapshot of the
// moment, with what was added while no ztunnel was there.
func TestSnapshotOnReconnect(t *testing.T) {
	p := &pods{}
	p.set(workload("a"))
	s, path := start(t, p)
	r := newRecorder()
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Serve(context.Background(), r) }()
	r.expect(t, "add a", "snapshot")
	c.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	waitFor(t, "disconnect", func() bool { return s.Stats().Connected == 0 })

	p.set(workload("a"), workload("b"))
	if err := s.Add(context.Background(), workload("b")); err != nil {
		t.Fatalf("add with no ztunnel: %v", err)
	}
	r2 := newRecorder()
	connect(t, path, r2)
	r2.expect(t, "add a", "add b", "snapshot")
	if got := s.Stats(); got.Handoffs != 3 || got.FailedHandoffs != 0 {
		t.Errorf("stats %+v", got)
	}
}

// TestKeep: a workload whose netns is unknown or cannot be opened is
// sent as KeepWorkload in the snapshot; Add refuses it.
func TestKeep(t *testing.T) {
	gone := workload("gone")
	gone.Netns = func() (*os.File, error) { return nil, os.ErrNotExist }
	unknown := workload("unknown")
	unknown.Netns = nil
	p := &pods{}
	p.set(gone, unknown)
	s, path := start(t, p)
	r := newRecorder()
	connect(t, path, r)
	r.expect(t, "keep gone", "keep unknown", "snapshot")
	if err := s.Add(context.Background(), unknown); err == nil {
		t.Error("add without netns: no error")
	}
	if err := s.Add(context.Background(), gone); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("add with a netns that does not open: %v", err)
	}
	if got := s.Stats(); got.FailedHandoffs != 2 || got.Handoffs != 0 {
		t.Errorf("stats %+v", got)
	}
}

// TestAckError: ztunnel's refusal is a failed hand-off, returned by Add,
// logged in a snapshot (which goes on).
func TestAckError(t *testing.T) {
	p := &pods{}
	p.set(workload("bad"), workload("good"))
	s, path := start(t, p)
	r := newRecorder()
	r.fail["bad"] = "no such pod"
	r.fail["worse"] = "cannot enter netns"
	connect(t, path, r)
	r.expect(t, "add bad", "add good", "snapshot")
	err := s.Add(context.Background(), workload("worse"))
	if err == nil || !strings.Contains(err.Error(), "cannot enter netns") {
		t.Errorf("add: %v, want ztunnel's error", err)
	}
	r.expect(t, "add worse")
	if got := s.Stats(); got != (Stats{Connected: 1, Handoffs: 1, FailedHandoffs: 2}) {
		t.Errorf("stats %+v", got)
	}
	// The connection is still good.
	if err := s.Add(context.Background(), workload("c")); err != nil {
		t.Fatal(err)
	}
	r.expect(t, "add c")
}

func TestAddNoZtunnel(t *testing.T) {
	s, _ := start(t, &pods{})
	if err := s.Add(context.Background(), workload("a")); err != nil {
		t.Fatal(err)
	}
	if err := s.Del(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if got := s.Stats(); got != (Stats{}) {
		t.Errorf("stats %+v", got)
	}
}

// rawPeer is a ztunnel that does what the test says, message by message.
type rawPeer struct {
	t  *testing.T
	uc *net.UnixConn
}

func dialRaw(t *testing.T, path string) *rawPeer {
	t.Helper()
	uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { uc.Close() })
	return &rawPeer{t: t, uc: uc}
}

func (p *rawPeer) send(m proto.Message) {
	p.t.Helper()
	data, err := proto.Marshal(m)
	if err != nil {
		p.t.Fatal(err)
	}
	p.sendRaw(data, nil)
}

func (p *rawPeer) sendRaw(data, oob []byte) {
	p.t.Helper()
	if _, _, err := p.uc.WriteMsgUnix(data, oob, nil); err != nil {
		p.t.Fatal(err)
	}
}

func (p *rawPeer) hello() { p.send(&ZdsHello{Version: Version_V1}) }
func (p *rawPeer) ack()   { p.send(&WorkloadResponse{Payload: &WorkloadResponse_Ack{Ack: &Ack{}}}) }

// recv reads the server's next message; nil when the server closed.
func (p *rawPeer) recv() *WorkloadRequest {
	p.t.Helper()
	buf := make([]byte, 4096)
	oob := make([]byte, unix.CmsgSpace(4))
	_ = p.uc.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, oobn, _, _, err := p.uc.ReadMsgUnix(buf, oob)
	if err != nil || n == 0 {
		return nil
	}
	closeAll(rights(oob[:oobn]))
	var m WorkloadRequest
	if err := proto.Unmarshal(buf[:n], &m); err != nil {
		p.t.Fatal(err)
	}
	return &m
}

// TestNoAck: a ztunnel that never acks makes Add fail after the timeout,
// the connection is dropped, and nothing is left running.
func TestNoAck(t *testing.T) {
	before := runtime.NumGoroutine()
	func() {
		s, path := start(t, &pods{})
		p := dialRaw(t, path)
		p.hello()
		if m := p.recv(); m.GetSnapshotSent() == nil {
			t.Fatalf("got %v, want snapshot sent", m)
		}
		p.ack()
		waitFor(t, "connected", func() bool { return s.Stats().Connected == 1 })
		err := s.Add(context.Background(), workload("a"))
		if err == nil || !strings.Contains(err.Error(), "no ack") {
			t.Fatalf("add: %v, want a timeout", err)
		}
		if m := p.recv(); m.GetAdd().GetUid() != "a" {
			t.Fatalf("got %v, want add a", m)
		}
		if m := p.recv(); m != nil {
			t.Fatalf("got %v after the timeout, want the connection closed", m)
		}
		waitFor(t, "disconnect", func() bool { return s.Stats().Connected == 0 })
		if got := s.Stats(); got.FailedHandoffs != 1 {
			t.Errorf("stats %+v", got)
		}
		// A ztunnel that does not even ack the snapshot is dropped too.
		p2 := dialRaw(t, path)
		p2.hello()
		if m := p2.recv(); m.GetSnapshotSent() == nil {
			t.Fatalf("got %v, want snapshot sent", m)
		}
		if m := p2.recv(); m != nil {
			t.Fatalf("got %v, want the connection closed", m)
		}
		s.Close()
	}()
	waitFor(t, "goroutines to end", func() bool { return runtime.NumGoroutine() <= before })
}

// TestAddContext: a caller's deadline bounds Add while the connection is
// busy (here, a snapshot ztunnel does not ack).
func TestAddContext(t *testing.T) {
	p := &pods{}
	p.set(workload("a"))
	s, path := startTimeout(t, p, 2*time.Second)
	peer := dialRaw(t, path)
	peer.hello()
	if m := peer.recv(); m.GetAdd() == nil {
		t.Fatalf("got %v, want add", m)
	}
	waitFor(t, "connected", func() bool { return s.Stats().Connected == 1 })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.Add(ctx, workload("b")); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("add: %v, want the deadline", err)
	}
}

// TestBadPeer: what a peer sends wrong ends its connection with a clear
// log line, never a panic, and the server serves the next ztunnel.
func TestBadPeer(t *testing.T) {
	s, path := start(t, &pods{})
	fd, err := ownNetns()
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	ackBytes, _ := proto.Marshal(&WorkloadResponse{Payload: &WorkloadResponse_Ack{Ack: &Ack{}}})
	cases := []struct {
		name  string
		hello bool // a good hello and an acked snapshot first
		data  []byte
		oob   []byte
	}{
		{name: "garbage hello", data: []byte{0xff, 0xff, 0xff}},
		{name: "hello without version", data: []byte{0x08, 0x00}},
		{name: "hello with a descriptor", data: []byte{0x08, 0x01}, oob: unix.UnixRights(int(fd.Fd()))},
		{name: "oversized hello", data: append([]byte{0x08, 0x01, 0x12, 0xcc, 0x08}, make([]byte, 1100)...)},
		{name: "unsolicited ack", hello: true, data: ackBytes},
		{name: "garbage", hello: true, data: []byte{0xff}},
		{name: "not an ack", hello: true, data: []byte{0x50, 0x01}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := dialRaw(t, path)
			if c.hello {
				p.hello()
				if m := p.recv(); m.GetSnapshotSent() == nil {
					t.Fatalf("got %v, want snapshot sent", m)
				}
				p.ack()
				waitFor(t, "connected", func() bool { return s.Stats().Connected == 1 })
			}
			p.sendRaw(c.data, c.oob)
			if m := p.recv(); m != nil {
				t.Fatalf("got %v, want the connection closed", m)
			}
			waitFor(t, "disconnect", func() bool { return s.Stats().Connected == 0 })
		})
	}
	r := newRecorder()
	connect(t, path, r)
	r.expect(t, "snapshot")
}

// TestDelAllConnections: Del goes to every connection, Add to the newest.
func TestDelAllConnections(t *testing.T) {
	s, path := start(t, &pods{})
	old, young := newRecorder(), newRecorder()
	connect(t, path, old)
	old.expect(t, "snapshot")
	waitFor(t, "connected", func() bool { return s.Stats().Connected == 1 })
	connect(t, path, young)
	young.expect(t, "snapshot")
	waitFor(t, "connected", func() bool { return s.Stats().Connected == 2 })
	if err := s.Add(context.Background(), workload("a")); err != nil {
		t.Fatal(err)
	}
	young.expect(t, "add a")
	if err := s.Del(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	old.expect(t, "del a")
	young.expect(t, "del a")
	select {
	case e := <-old.events:
		t.Errorf("the older connection got %v", e)
	default:
	}
}

// TestClientProtocol: the client acks what it cannot do with the reason,
// and stops at what it cannot read.
func TestClientProtocol(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]*net.UnixConn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), fmt.Sprint("pair", i))
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c.(*net.UnixConn)
		defer c.Close()
	}
	agent := &rawPeer{t: t, uc: conns[0]}
	client := &Client{uc: conns[1]}
	r := newRecorder()
	done := make(chan error, 1)
	go func() { done <- client.Serve(context.Background(), r) }()
	readAck := func() string {
		t.Helper()
		buf := make([]byte, 1024)
		_ = agent.uc.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, err := agent.uc.Read(buf)
		if err != nil {
			t.Fatal(err)
		}
		m, err := DecodeResponse(buf[:n])
		if err != nil {
			t.Fatal(err)
		}
		return m.GetAck().GetError()
	}
	// An add without its netns.
	agent.send(&WorkloadRequest{Payload: &WorkloadRequest_Add{Add: &AddWorkload{Uid: "a"}}})
	if e := readAck(); !strings.Contains(e, "0 file descriptors") {
		t.Errorf("ack %q, want the missing netns", e)
	}
	agent.send(&WorkloadRequest{Payload: &WorkloadRequest_Keep{Keep: &KeepWorkload{Uid: "k"}}})
	r.expect(t, "keep k")
	if e := readAck(); e != "" {
		t.Errorf("keep: ack error %q", e)
	}
	// A message of a later protocol: no payload this client knows.
	agent.sendRaw([]byte{0x50, 0x01}, nil)
	if err := <-done; err == nil || !strings.Contains(err.Error(), "unknown message") {
		t.Errorf("serve: %v, want a protocol error", err)
	}
}

// FuzzDecode: whatever a peer sends, decoding returns a message or an
// error, never panics.
func FuzzDecode(f *testing.F) {
	ack, _ := proto.Marshal(&WorkloadResponse{Payload: &WorkloadResponse_Ack{Ack: &Ack{Error: "x"}}})
	hello, _ := proto.Marshal(&ZdsHello{Version: Version_V1})
	for _, seed := range [][]byte{ack, hello, {}, {0xff}, {0x50, 0x01}} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if m, err := DecodeResponse(data); err == nil && m.GetAck() == nil {
			t.Fatal("decoded a response without an ack")
		}
		if h, err := DecodeHello(data); err == nil && h.GetVersion() == Version_NOT_USED {
			t.Fatal("decoded a hello without a version")
		}
	})
}
