// Package structlayout describes a Go struct's memory layout, so that tests
// can check that a struct meshwire writes into a BPF map without loading
// the object has the layout of bpf2go's type for the C struct.
package structlayout

import (
	"fmt"
	"reflect"
)

// Describe lists v's fields (bpf2go's padding, fields named "_", left out)
// as "offset:size", prefixed with the field's name and "@" when named is
// set ("@offset:size" otherwise), then the struct's size.
func Describe(v any, named bool) []string {
	var out []string
	ty := reflect.TypeOf(v)
	for i := range ty.NumField() {
		if f := ty.Field(i); f.Name != "_" {
			name := ""
			if named {
				name = f.Name
			}
			out = append(out, fmt.Sprintf("%s@%d:%d", name, f.Offset, f.Type.Size()))
		}
	}
	return append(out, fmt.Sprint(ty.Size()))
}
