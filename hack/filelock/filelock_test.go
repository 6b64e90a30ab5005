package filelock

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A second holder waits until the first releases the lock.
func TestLockWaitsForTheHolder(t *testing.T) {
	file := filepath.Join(t.TempDir(), ".lock")
	unlock, err := Lock(file)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan func(), 1)
	go func() {
		second, err := Lock(file)
		if err != nil {
			t.Error(err)
			second = func() {}
		}
		got <- second
	}()
	select {
	case <-got:
		t.Fatal("a second Lock returned while the first was held")
	case <-time.After(200 * time.Millisecond):
	}
	unlock()
	select {
	case second := <-got:
		second()
	case <-time.After(10 * time.Second):
		t.Fatal("a second Lock still waits 10s after the first was released")
	}
}

// A folder that does not exist gives an error, not a wait.
func TestLockOfAMissingFolder(t *testing.T) {
	if _, err := Lock(filepath.Join(t.TempDir(), "missing", ".lock")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Lock in a missing folder: %v, want that it does not exist", err)
	}
}
