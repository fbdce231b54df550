package link

import (
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// msg builds one netlink message of type typ about link idx.
func msg(typ uint16, idx int32) []byte {
	b := make([]byte, unix.NLMSG_HDRLEN+unix.SizeofIfInfomsg+6) // an unaligned length
	binary.NativeEndian.PutUint32(b[0:4], uint32(len(b)))
	binary.NativeEndian.PutUint16(b[4:6], typ)
	binary.NativeEndian.PutUint32(b[unix.NLMSG_HDRLEN+4:], uint32(idx))
	for len(b)%unix.NLMSG_ALIGNTO != 0 {
		b = append(b, 0)
	}
	return b
}

func TestRemoved(t *testing.T) {
	batch := append(append(msg(unix.RTM_NEWLINK, 7), msg(unix.RTM_DELLINK, 8)...), msg(unix.RTM_DELLINK, 7)...)
	if !removed(batch, 7) || !removed(batch, 8) {
		t.Fatal("removal in a batch not seen")
	}
	if removed(batch, 9) || removed(msg(unix.RTM_NEWLINK, 7), 7) {
		t.Fatal("a removal seen that is not there")
	}
	for _, bad := range [][]byte{nil, {1, 2, 3}, msg(unix.RTM_DELLINK, 7)[:20]} {
		if removed(bad, 7) {
			t.Fatalf("truncated input %v read as a removal", bad)
		}
	}
}
