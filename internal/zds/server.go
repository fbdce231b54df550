package zds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

const (
	// MaxMessage bounds one message either way: istio-cni reads ztunnel's
	// messages into 1024 bytes, and meshwire sends nothing larger (a pod's
	// uid, name, namespace and service account fit with room to spare).
	MaxMessage = 1024
	// Timeout bounds each step of the exchange, as istio-cni's
	// readWriteDeadline: reading the hello, writing a message, its ack.
	Timeout = 5 * time.Second
	// acceptInterval rate-limits connections (istio-cni: 5 a second), so
	// that a ztunnel reconnecting in a loop cannot make the agent spin.
	acceptInterval = 200 * time.Millisecond
)

// Workload is one enrolled pod as the agent hands it to ztunnel.
type Workload struct {
	UID, Name, Namespace, ServiceAccount string
	// Netns opens the pod's network namespace; the server closes the file
	// once sent. Nil means the namespace is not available: a snapshot
	// then sends KeepWorkload (ztunnel keeps the pod if it has it) and
	// Add refuses the workload.
	Netns func() (*os.File, error)
}

func (w Workload) info() *WorkloadInfo {
	return &WorkloadInfo{Name: w.Name, Namespace: w.Namespace, ServiceAccount: w.ServiceAccount}
}

// Stats are the server's metrics.
type Stats struct {
	Connected      int    // ztunnel connections that said hello (a gauge)
	Handoffs       uint64 // AddWorkload messages ztunnel acknowledged without error
	FailedHandoffs uint64 // AddWorkload not handed off: netns not opened, not sent, not acknowledged, or acknowledged with an error
}

// Server is the node agent's end of ZDS.
type Server struct {
	path     string
	ln       *net.UnixListener
	snapshot func() []Workload
	timeout  time.Duration

	mu     sync.Mutex
	conns  []*conn // said hello, oldest first
	stop   chan struct{}
	closed bool
	wg     sync.WaitGroup

	handoffs, failed atomic.Uint64
}

// Listen creates the socket at path (its directory if missing, a socket
// file left by an earlier agent removed), readable and writable by its
// owner only: whoever connects is handed pods' network namespaces.
// snapshot returns every enrolled workload; it is read on each ztunnel
// connection, after the connection counts for Add and Del, so a caller
// that records a workload before calling Add (and forgets it before Del)
// never loses one between a snapshot and an update. The server logs
// through log/slog's default logger.
func Listen(path string, snapshot func() []Workload) (*Server, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("zds: socket directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("zds: remove stale socket %s: %w", path, err)
	}
	// The umask covers the window between bind and chmod.
	old := unix.Umask(0o177)
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	unix.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("zds: listen %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("zds: %w", err)
	}
	return &Server{path: path, ln: ln, snapshot: snapshot, timeout: Timeout, stop: make(chan struct{})}, nil
}

// Serve accepts ztunnel connections until ctx ends or Close, then closes
// the server. Each connection gets the snapshot, then the updates.
func (s *Server) Serve(ctx context.Context) error {
	defer context.AfterFunc(ctx, func() { _ = s.Close() })()
	var last time.Time
	for {
		if d := acceptInterval - time.Since(last); d > 0 {
			select {
			case <-time.After(d):
			case <-s.stop:
				return nil
			}
		}
		uc, err := s.ln.AcceptUnix()
		last = time.Now()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			slog.Warn("ZDS: accept", "error", err)
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			uc.Close()
			return nil
		}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			s.handle(uc)
		}()
	}
}

// Close stops accepting, closes every ztunnel connection, waits for their
// goroutines and removes the socket file.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.stop)
	s.mu.Unlock()
	err := s.ln.Close()
	s.wg.Wait()
	return err
}

// Stats returns the server's gauge and counters.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	n := len(s.conns)
	s.mu.Unlock()
	return Stats{Connected: n, Handoffs: s.handoffs.Load(), FailedHandoffs: s.failed.Load()}
}

// Add hands w to the newest ztunnel connection and waits for its ack; an
// ack carrying an error is returned as one. With no ztunnel connected (or
// the connection gone before w was sent) it returns nil: w is in the
// snapshot the next ztunnel gets.
func (s *Server) Add(ctx context.Context, w Workload) error {
	if w.UID == "" {
		return errors.New("zds: add: workload without uid")
	}
	if w.Netns == nil {
		return fmt.Errorf("zds: add %s: no network namespace", w.UID)
	}
	s.mu.Lock()
	var c *conn
	if len(s.conns) > 0 {
		c = s.conns[len(s.conns)-1]
	}
	s.mu.Unlock()
	if c == nil {
		slog.Info("ZDS: no ztunnel connected; it gets the pod in its snapshot", "uid", w.UID)
		return nil
	}
	return c.do(ctx, &request{add: &w})
}

// Del tells every ztunnel connection (the newest and any older one still
// draining) that the workload is gone, and waits for their acks.
func (s *Server) Del(ctx context.Context, uid string) error {
	if uid == "" {
		return errors.New("zds: del: empty uid")
	}
	s.mu.Lock()
	conns := append([]*conn(nil), s.conns...)
	s.mu.Unlock()
	var errs []error
	for _, c := range conns {
		msg := &WorkloadRequest{Payload: &WorkloadRequest_Del{Del: &DelWorkload{Uid: uid}}}
		errs = append(errs, c.do(ctx, &request{msg: msg}))
	}
	return errors.Join(errs...)
}

// request is one message for a connection's goroutine to send: add (its
// netns opened there, closed once sent) or msg; the outcome goes to resp.
type request struct {
	add  *Workload
	msg  *WorkloadRequest
	resp chan error
}

// conn is one ztunnel connection. Its goroutine alone writes to it, so
// that each ack is the answer to the message just sent (acks carry no
// correlation but their order).
type conn struct {
	s    *Server
	uc   *net.UnixConn
	reqs chan *request // unbuffered: a request taken is a request answered
	done chan struct{} // closed when the connection's goroutine ends
	acks chan *WorkloadResponse
	rerr chan error // the reader's end (EOF or a protocol error)
}

// do hands r to the connection's goroutine and waits for the outcome.
func (c *conn) do(ctx context.Context, r *request) error {
	r.resp = make(chan error, 1)
	select {
	case c.reqs <- r:
	case <-c.done:
		// Never sent: the next ztunnel's snapshot carries the state.
		return nil
	case <-ctx.Done():
		return fmt.Errorf("zds: not sent: %w", ctx.Err())
	}
	select {
	case err := <-r.resp:
		return err
	case <-ctx.Done():
		return fmt.Errorf("zds: no answer: %w", ctx.Err())
	}
}

func (s *Server) handle(uc *net.UnixConn) {
	c := &conn{s: s, uc: uc, reqs: make(chan *request), done: make(chan struct{}),
		acks: make(chan *WorkloadResponse), rerr: make(chan error, 1)}
	defer uc.Close()
	hello, err := c.readHello()
	if err != nil {
		slog.Warn("ZDS: ztunnel connection dropped", "error", err)
		return
	}
	slog.Info("ZDS: ztunnel connected", "version", hello.GetVersion().String())

	s.mu.Lock()
	s.conns = append(s.conns, c)
	s.mu.Unlock()
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		c.read()
	}()
	defer func() {
		s.mu.Lock()
		for i, o := range s.conns {
			if o == c {
				s.conns = append(s.conns[:i:i], s.conns[i+1:]...)
				break
			}
		}
		s.mu.Unlock()
		close(c.done)
		uc.Close()
		<-readerDone
	}()

	if err := c.sendSnapshot(); err != nil {
		slog.Warn("ZDS: ztunnel connection dropped during the snapshot", "error", err)
		return
	}
	for {
		select {
		case r := <-c.reqs:
			err := c.serve(r)
			r.resp <- err
			if errors.Is(err, errConn) {
				slog.Warn("ZDS: ztunnel connection dropped", "error", err)
				return
			}
		case m := <-c.acks:
			slog.Warn("ZDS: ztunnel connection dropped: protocol error: unsolicited message", "message", fmt.Sprint(m))
			return
		case err := <-c.rerr:
			if errors.Is(err, io.EOF) {
				slog.Info("ZDS: ztunnel disconnected")
			} else {
				slog.Warn("ZDS: ztunnel connection dropped", "error", err)
			}
			return
		case <-s.stop:
			return
		}
	}
}

// errConn marks the errors after which the connection cannot go on: a
// message not written, or an ack not read (a late ack would answer the
// next message). ztunnel reconnects and gets a fresh snapshot.
var errConn = errors.New("ztunnel connection lost")

// serve sends one request and reads its ack.
func (c *conn) serve(r *request) error {
	if r.add == nil {
		ack, err := c.exchange(r.msg, nil)
		if err != nil {
			return err
		}
		if ack.GetError() != "" {
			return fmt.Errorf("zds: ztunnel: %s", ack.GetError())
		}
		return nil
	}
	w := r.add
	ns, err := w.Netns()
	if err != nil {
		c.s.failed.Add(1)
		return fmt.Errorf("zds: add %s: open netns: %w", w.UID, err)
	}
	defer ns.Close()
	return c.handoff(w, ns)
}

// handoff sends AddWorkload for w with its netns and counts the outcome.
func (c *conn) handoff(w *Workload, ns *os.File) error {
	msg := &WorkloadRequest{Payload: &WorkloadRequest_Add{Add: &AddWorkload{Uid: w.UID, WorkloadInfo: w.info()}}}
	ack, err := c.exchange(msg, ns)
	if err == nil && ack.GetError() != "" {
		err = fmt.Errorf("zds: add %s: ztunnel: %s", w.UID, ack.GetError())
	}
	if err != nil {
		c.s.failed.Add(1)
		return err
	}
	c.s.handoffs.Add(1)
	return nil
}

// sendSnapshot sends every workload, then SnapshotSent. A workload that
// ztunnel refuses is logged and counted, and the snapshot goes on, as
// istio-cni's does; a lost connection ends it.
func (c *conn) sendSnapshot() error {
	for _, w := range c.s.snapshot() {
		if w.Netns != nil {
			ns, err := w.Netns()
			if err == nil {
				err = c.handoff(&w, ns)
				ns.Close()
				if errors.Is(err, errConn) {
					return err
				}
				if err != nil {
					slog.Warn("ZDS: snapshot", "error", err)
				}
				continue
			}
			c.s.failed.Add(1)
			slog.Warn("ZDS: snapshot: cannot open the pod's namespace; sending keep", "uid", w.UID, "error", err)
		}
		msg := &WorkloadRequest{Payload: &WorkloadRequest_Keep{Keep: &KeepWorkload{Uid: w.UID}}}
		ack, err := c.exchange(msg, nil)
		if err != nil {
			return err
		}
		if ack.GetError() != "" {
			slog.Warn("ZDS: snapshot: keep refused by ztunnel", "uid", w.UID, "error", ack.GetError())
		}
	}
	ack, err := c.exchange(&WorkloadRequest{Payload: &WorkloadRequest_SnapshotSent{SnapshotSent: &SnapshotSent{}}}, nil)
	if err != nil {
		return err
	}
	if ack.GetError() != "" {
		slog.Warn("ZDS: snapshot sent: ztunnel answered an error", "error", ack.GetError())
	}
	return nil
}

// exchange writes msg (with fd as SCM_RIGHTS when not nil) and waits for
// ztunnel's ack. Errors wrap errConn.
func (c *conn) exchange(msg *WorkloadRequest, fd *os.File) (*Ack, error) {
	data, err := proto.Marshal(msg)
	if err != nil {
		return nil, fmt.Errorf("%w: marshal: %v", errConn, err)
	}
	if len(data) > MaxMessage {
		// Not a connection fault, but ztunnel would get it truncated.
		return nil, fmt.Errorf("zds: message of %d bytes, more than %d", len(data), MaxMessage)
	}
	var oob []byte
	if fd != nil {
		oob = unix.UnixRights(int(fd.Fd()))
	}
	if err := c.uc.SetWriteDeadline(time.Now().Add(c.s.timeout)); err != nil {
		return nil, fmt.Errorf("%w: %v", errConn, err)
	}
	if _, _, err := c.uc.WriteMsgUnix(data, oob, nil); err != nil {
		return nil, fmt.Errorf("%w: send: %v", errConn, err)
	}
	t := time.NewTimer(c.s.timeout)
	defer t.Stop()
	select {
	case m := <-c.acks:
		return m.GetAck(), nil
	case err := <-c.rerr:
		return nil, fmt.Errorf("%w: waiting for ack: %v", errConn, err)
	case <-t.C:
		return nil, fmt.Errorf("%w: no ack within %v", errConn, c.s.timeout)
	case <-c.s.stop:
		return nil, fmt.Errorf("%w: server closed", errConn)
	}
}

func (c *conn) readHello() (*ZdsHello, error) {
	if err := c.uc.SetReadDeadline(time.Now().Add(c.s.timeout)); err != nil {
		return nil, err
	}
	data, err := readMsg(c.uc)
	if err != nil {
		return nil, fmt.Errorf("hello: %w", err)
	}
	h, err := DecodeHello(data)
	if err != nil {
		return nil, err
	}
	return h, c.uc.SetReadDeadline(time.Time{})
}

// read delivers ztunnel's messages to acks until the connection ends,
// then reports why on rerr.
func (c *conn) read() {
	for {
		data, err := readMsg(c.uc)
		var m *WorkloadResponse
		if err == nil {
			m, err = DecodeResponse(data)
		}
		if err != nil {
			c.rerr <- err
			return
		}
		select {
		case c.acks <- m:
		case <-c.done:
			return
		}
	}
}

// readMsg reads one datagram of at most MaxMessage bytes. File
// descriptors ztunnel has no reason to send are closed and refused.
func readMsg(uc *net.UnixConn) ([]byte, error) {
	buf := make([]byte, MaxMessage+1)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := uc.ReadMsgUnix(buf, oob)
	if err != nil {
		if errors.Is(err, net.ErrClosed) {
			return nil, io.EOF
		}
		return nil, err
	}
	if oobn > 0 {
		closeAll(rights(oob[:oobn]))
		return nil, errors.New("protocol error: file descriptors from ztunnel")
	}
	if n == 0 && flags == 0 {
		// A zero-length read on SOCK_SEQPACKET is the peer's close (an
		// empty message would also decode as an empty ack: refuse both).
		return nil, io.EOF
	}
	if n > MaxMessage || flags&unix.MSG_TRUNC != 0 {
		return nil, fmt.Errorf("protocol error: message larger than %d bytes", MaxMessage)
	}
	if flags&unix.MSG_CTRUNC != 0 {
		return nil, errors.New("protocol error: truncated control message")
	}
	return buf[:n], nil
}

// DecodeHello decodes ztunnel's first message. Version 0 is refused: it is
// what an empty or foreign message decodes to; later versions than V1
// are taken, as istio-cni takes them.
func DecodeHello(data []byte) (*ZdsHello, error) {
	var h ZdsHello
	if err := proto.Unmarshal(data, &h); err != nil {
		return nil, fmt.Errorf("protocol error: hello: %w", err)
	}
	if h.GetVersion() == Version_NOT_USED {
		return nil, errors.New("protocol error: hello without a version")
	}
	return &h, nil
}

// DecodeResponse decodes a message from ztunnel after its hello: an ack,
// nothing else.
func DecodeResponse(data []byte) (*WorkloadResponse, error) {
	var m WorkloadResponse
	if err := proto.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("protocol error: %w", err)
	}
	if m.GetAck() == nil {
		return nil, errors.New("protocol error: a message from ztunnel that is not an ack")
	}
	return &m, nil
}
