package nettest

import (
	"context"
	"net"
	"sync"
)

// PipeListener is a listener whose connections are in-memory net.Pipe
// pairs that Dial makes: a server and its clients talk without the
// network, so that a testing/synctest bubble can hold both (a goroutine
// blocked on a pipe is durably blocked; one blocked on a socket is not).
type PipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func NewPipeListener() *PipeListener {
	return &PipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// Dial connects to the listener; it has http.Transport.DialContext's
// signature, whatever the address.
func (l *PipeListener) Dial(ctx context.Context, _, _ string) (net.Conn, error) {
	client, server := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
	case <-ctx.Done():
	}
	client.Close()
	server.Close()
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	return nil, net.ErrClosed
}

func (l *PipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *PipeListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *PipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }
