package wal

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	bolt "go.etcd.io/bbolt"
)

// view runs fn in a read transaction. bbolt panics on a page it cannot
// make sense of (damage inside the file that its meta pages' checksums do
// not cover: a branch pointing past the file, a leaf of garbage); such a
// panic, raised in bbolt's code, becomes a *CorruptionError naming the
// file, so that the read that met the page fails, rather than the
// process. A panic raised anywhere else (fn's own) is not caught.
func (w *WAL) view(fn func(*bolt.Tx) error) error {
	return damagedPage(w.path, func() error { return w.db.View(fn) })
}

// damagedPage runs tx, a bbolt transaction of the file at path, turning a
// panic bbolt raises in it into a *CorruptionError (see view).
func damagedPage(path string, tx func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			if !panickedInBolt(r) {
				panic(r)
			}
			err = &CorruptionError{Path: path, Offset: -1,
				Err: fmt.Errorf("a page of the file is damaged (bbolt: %v); forwarder wal verify says where, and forwarder wal dump saves the records it can still read", r)}
		}
	}()
	// A page id past the mapping faults rather than panics.
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	return tx()
}

// panickedInBolt reports, from a deferred call during a panic, whether the
// panic was raised in bbolt's code: walking out from where it was raised,
// past the runtime's panic machinery and the standard library's functions
// bbolt calls (bytes.Compare, sort.Search), a frame of bbolt comes before
// one of this module's (the caller's own code, a callback a scan runs, or
// this package's reading bbolt's answer). A fault at an address (not a nil
// dereference) inside a transaction is the mapped file's: damage too.
func panickedInBolt(r any) bool {
	if f, ok := r.(interface{ Addr() uintptr }); ok && f.Addr() != 0 {
		return true
	}
	pcs := make([]uintptr, 64)
	n := runtime.Callers(3, pcs) // above runtime.Callers, this and the deferred call
	frames := runtime.CallersFrames(pcs[:n])
	for {
		f, more := frames.Next()
		switch {
		case strings.HasPrefix(f.Function, "go.etcd.io/bbolt"):
			return true
		case strings.HasPrefix(f.Function, "github.com/logfwd/"):
			return false
		}
		if !more {
			return false
		}
	}
}
