package harness

import (
	"os"
	"testing"
	"time"

	"github.com/meshwire/meshwire/internal/hostlocal/store"
)

// Reservations counts the addresses host-local holds for network in
// dataDir: meshwire's store and the reference's one-file-per-address
// layout alike (opening the store imports reference files).
func Reservations(t testing.TB, dataDir, network string) int {
	t.Helper()
	if _, err := os.Stat(store.Dir(dataDir, network)); err != nil {
		return 0
	}
	s, err := store.Open(dataDir, network, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	n := 0
	if err := s.View(func(tx *store.Tx) error {
		return tx.ForEach(func(store.Allocation) error { n++; return nil })
	}); err != nil {
		t.Fatal(err)
	}
	return n
}
