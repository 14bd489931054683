package forward

import (
	"bytes"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// TestEndReadsKeepsTheClosingDiscard: a connection that a stopping server
// closes first reads what its client still sends, for up to closeLinger
// (closing a socket with unread bytes in it resets the connection, and a
// reset can destroy acks on their way to the client); the end of the
// server's read time (endReads) does not cut that short.
func TestEndReadsKeepsTheClosingDiscard(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	c := &conn{nc: server, gone: true}
	ack := []byte(`{"ack":"the last chunk"}`)
	if _, err := server.Write(ack); err != nil {
		t.Fatal(err)
	}

	// The client is in the middle of a message: it goes on sending for
	// 300 ms after the server's FIN, then half-closes.
	fin := make(chan []byte, 1)
	go func() {
		got, _ := io.ReadAll(client)
		fin <- got
	}()
	var (
		wg       sync.WaitGroup
		writeErr error
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		chunk := bytes.Repeat([]byte("x"), 1024)
		var stopAt time.Time
		for {
			select {
			case got := <-fin:
				if !bytes.Equal(got, ack) {
					t.Errorf("the client read %q before the server's FIN, want the ack %q", got, ack)
				}
				stopAt = time.Now().Add(300 * time.Millisecond)
			default:
			}
			if !stopAt.IsZero() && time.Now().After(stopAt) {
				client.(*net.TCPConn).CloseWrite()
				return
			}
			if _, err := client.Write(chunk); err != nil {
				writeErr = err
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()

	closed := make(chan time.Duration, 1)
	start := time.Now()
	go func() {
		c.close()
		closed <- time.Since(start)
	}()
	time.Sleep(50 * time.Millisecond)
	c.endReads() // the server's read time is over while the discard goes on
	took := <-closed
	wg.Wait()
	if writeErr != nil {
		t.Errorf("the client's writes after the server's FIN failed: %v (the connection was reset)", writeErr)
	}
	if took < 250*time.Millisecond {
		t.Errorf("close returned after %v, while the client was still sending for 300 ms: endReads cut its discard short", took)
	}
}
