// Package nettest holds network fakes for tests.
package nettest

import (
	"net"
	"os"
	"sync"
	"syscall"
)

// FaultListener fails its first accepts with Errs, then, if set with
// SetAlways, every accept with that error; else it accepts for real.
type FaultListener struct {
	net.Listener
	Errs []error

	mu     sync.Mutex
	always error
}

// SetAlways makes every accept after Errs fail with err (nil: accept for real).
func (f *FaultListener) SetAlways(err error) {
	f.mu.Lock()
	f.always = err
	f.mu.Unlock()
}

func (f *FaultListener) Accept() (net.Conn, error) {
	f.mu.Lock()
	if len(f.Errs) > 0 {
		err := f.Errs[0]
		f.Errs = f.Errs[1:]
		f.mu.Unlock()
		return nil, err
	}
	always := f.always
	f.mu.Unlock()
	if always != nil {
		return nil, always
	}
	return f.Listener.Accept()
}

// AcceptError is what Accept returns when accept(2) fails with errno.
func AcceptError(errno syscall.Errno) error {
	return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", errno)}
}
