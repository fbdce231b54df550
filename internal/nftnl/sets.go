package nftnl

import (
	"bytes"

	"golang.org/x/sys/unix"
)

// SetElements reads the keys of the elements of set name in table (of
// family fam): each key's bytes, an address of the set's type. A table or
// set that is not there is unix.ENOENT.
func (c *Conn) SetElements(fam Family, table, name string) ([][]byte, error) {
	var keys [][]byte
	attrs := []Attr{StrAttr(unix.NFTA_SET_ELEM_LIST_TABLE, table), StrAttr(unix.NFTA_SET_ELEM_LIST_SET, name)}
	err := c.Dump(unix.NFT_MSG_GETSETELEM, fam, attrs, func() { keys = nil }, func(obj []byte) {
		EachAttr(obj, func(t uint16, list []byte) {
			if t != unix.NFTA_SET_ELEM_LIST_ELEMENTS {
				return
			}
			EachAttr(list, func(t uint16, elem []byte) {
				if t != unix.NFTA_LIST_ELEM {
					return
				}
				EachAttr(elem, func(t uint16, key []byte) {
					if t != unix.NFTA_SET_ELEM_KEY {
						return
					}
					EachAttr(key, func(t uint16, v []byte) {
						if t == unix.NFTA_DATA_VALUE {
							keys = append(keys, bytes.Clone(v))
						}
					})
				})
			})
		})
	})
	return keys, err
}
