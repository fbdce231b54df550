package zds

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
)

// Handler is what ztunnel does with the agent's messages. The error of
// each call, if any, goes back as the ack's error text.
type Handler interface {
	// Add takes the workload's netns; the handler owns the file.
	Add(uid string, info *WorkloadInfo, netns *os.File) error
	// Keep: during a snapshot, a workload the agent has but whose netns
	// it could not open; keep it if held.
	Keep(uid string) error
	Del(uid string) error
	// SnapshotSent ends a snapshot: workloads held but neither added nor
	// kept since the connection began are gone.
	SnapshotSent() error
}

// Client is ztunnel's end of ZDS.
type Client struct {
	uc *net.UnixConn
}

// Dial connects to the agent's socket and says hello (version V1).
func Dial(path string) (*Client, error) {
	uc, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("zds: %w", err)
	}
	data, err := proto.Marshal(&ZdsHello{Version: Version_V1})
	if err == nil {
		_, err = uc.Write(data)
	}
	if err != nil {
		uc.Close()
		return nil, fmt.Errorf("zds: hello: %w", err)
	}
	return &Client{uc: uc}, nil
}

// Close closes the connection (Serve returns).
func (c *Client) Close() error { return c.uc.Close() }

// Serve delivers the agent's messages to h, acknowledging each, until the
// agent closes the connection (nil), ctx ends (nil) or the agent breaks
// the protocol (an error).
func (c *Client) Serve(ctx context.Context, h Handler) error {
	defer context.AfterFunc(ctx, func() { _ = c.uc.Close() })()
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(4*4))
	for {
		n, oobn, flags, _, err := c.uc.ReadMsgUnix(buf, oob)
		if err != nil || (n == 0 && oobn == 0) {
			if ctx.Err() != nil || err == nil || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("zds: read: %w", err)
		}
		fds := rights(oob[:oobn])
		if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
			closeAll(fds)
			return errors.New("zds: protocol error: truncated message")
		}
		herr := c.deliver(h, buf[:n], fds)
		if herr != nil && errors.Is(herr, errProtocol) {
			return herr
		}
		ack := &Ack{}
		if herr != nil {
			ack.Error = herr.Error()
		}
		data, err := proto.Marshal(&WorkloadResponse{Payload: &WorkloadResponse_Ack{Ack: ack}})
		if err != nil {
			return err
		}
		if _, err := c.uc.Write(data); err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("zds: ack: %w", err)
		}
	}
}

var errProtocol = errors.New("zds: protocol error")

// deliver decodes one message and calls h; fds are the descriptors that
// came with it, handed to Add or closed.
func (c *Client) deliver(h Handler, data []byte, fds []int) error {
	var m WorkloadRequest
	if err := proto.Unmarshal(data, &m); err != nil {
		closeAll(fds)
		return fmt.Errorf("%w: %v", errProtocol, err)
	}
	if add := m.GetAdd(); add != nil {
		if len(fds) != 1 {
			closeAll(fds)
			return fmt.Errorf("add %s: %d file descriptors, want the netns", add.GetUid(), len(fds))
		}
		return h.Add(add.GetUid(), add.GetWorkloadInfo(), os.NewFile(uintptr(fds[0]), "netns:"+add.GetUid()))
	}
	closeAll(fds)
	switch {
	case m.GetKeep() != nil:
		return h.Keep(m.GetKeep().GetUid())
	case m.GetDel() != nil:
		return h.Del(m.GetDel().GetUid())
	case m.GetSnapshotSent() != nil:
		return h.SnapshotSent()
	}
	return fmt.Errorf("%w: unknown message", errProtocol)
}

// rights returns the file descriptors an SCM_RIGHTS message carried.
func rights(oob []byte) []int {
	if len(oob) == 0 {
		return nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if got, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}
