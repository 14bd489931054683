package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/tinylib/msgp/msgp"
)

// forwardGen sends Fluent forward protocol messages over TCP. With acks,
// each message carries option.chunk and the connection waits for
// {"ack": chunk} before it sends the next one, as Fluent Bit does with
// Require_ack_response.
type forwardGen struct {
	addr  string
	conns int
	ack   bool
	mode  string
	tag   string
	tags  int
	rate  float64
}

func (g *forwardGen) register(f *flag.FlagSet) {
	f.StringVar(&g.addr, "addr", "127.0.0.1:24224", "the forward input's address")
	f.IntVar(&g.conns, "conns", 8, "connections, each sending one message at a time")
	f.BoolVar(&g.ack, "ack", true, "ask for an ack of each message (option.chunk) and wait for it")
	f.StringVar(&g.mode, "mode", "packed", "packed (PackedForward), forward (Forward) or message (Message: one record a message; a batch's messages are written together, then their acks read)")
	f.StringVar(&g.tag, "tag", "pod.shop", "the messages' tag")
	f.IntVar(&g.tags, "tags", 1, "spread the messages over this many tags, TAG.0 to TAG.<n-1> (1: TAG alone)")
	f.Float64Var(&g.rate, "rate", 0, "records a second over all connections, at most (0: as fast as the acks come)")
}

func (g *forwardGen) check(o *options) error {
	switch {
	case g.conns < 1:
		return errors.New("-conns must be at least 1")
	case g.mode != "packed" && g.mode != "forward" && g.mode != "message":
		return fmt.Errorf("-mode %q: want packed, forward or message", g.mode)
	case g.tag == "":
		return errors.New("-tag must not be empty")
	case g.tags < 1:
		return errors.New("-tags must be at least 1")
	case g.rate < 0:
		return errors.New("-rate must not be negative")
	case o.idsPath != "" && !g.ack:
		return errors.New("-ids needs -ack: without acks nothing is known to be stored")
	}
	return nil
}

func (g *forwardGen) workers() int { return g.conns }

func (g *forwardGen) describe(r *result) {
	r.Mode, r.Target, r.Format, r.Acks = "forward", g.addr, g.mode, g.ack
}

// fwdConn is one connection's state.
type fwdConn struct {
	g     *forwardGen
	o     *options
	c     int
	pool  *pool
	st    *stats
	ids   idBuf
	nc    net.Conn
	rd    *msgp.Reader
	next  uint64 // number of the next record (its id's last part)
	chunk uint64 // number of the next chunk id
	built uint64 // messages built, for the choice of their tags

	msg    []byte   // the message(s) to send
	chunks []string // their chunk ids, in order
	jsonN  uint64   // JSON bytes of their records
}

func (g *forwardGen) work(c int, o *options, st *stats, stop <-chan struct{}, ids *idWriter) {
	idLen := len(o.runID) + len(strconv.Itoa(c)) + 8
	fc := &fwdConn{g: g, o: o, c: c, st: st, pool: newPool(o.seed, o.seed+int64(c), 1024, o.size, idLen, true),
		ids: idBuf{w: ids, run: o.runID, c: c}}
	defer func() {
		if fc.nc != nil {
			fc.nc.Close()
		}
		if ids != nil {
			fc.ids.flush()
		}
	}()
	// With -rate, each connection sends its share: a message every
	// interval, from a start of its own within the first interval.
	var interval time.Duration
	next := time.Now()
	if g.rate > 0 {
		interval = time.Duration(float64(o.batch*g.conns) / g.rate * float64(time.Second))
		next = next.Add(interval * time.Duration(c) / time.Duration(g.conns))
	}
	for sent := 0; o.messages == 0 || sent < o.messages; sent++ {
		if interval > 0 {
			if d := time.Until(next); d > 0 {
				select {
				case <-stop:
					return
				case <-time.After(d):
				}
			}
			next = next.Add(interval)
		}
		select {
		case <-stop:
			return
		default:
		}
		first := fc.next
		fc.build(time.Now())
		if !fc.send(first, stop) {
			return
		}
	}
}

// build makes the next message (in Message mode, a batch of them).
// appendTag appends the next message's tag: -tag, or with -tags n the
// connection's messages go to TAG.0 ... TAG.<n-1> in turn, each connection
// starting at another one, spread evenly over the tags so that all of them
// get messages from the start.
func (fc *fwdConn) appendTag(b []byte) []byte {
	g := fc.g
	if g.tags <= 1 {
		return msgp.AppendString(b, g.tag)
	}
	i := (fc.built + uint64(fc.c)*uint64(g.tags)/uint64(g.conns)) % uint64(g.tags)
	fc.built++
	return msgp.AppendString(b, g.tag+"."+strconv.FormatUint(i, 10))
}

func (fc *fwdConn) build(now time.Time) {
	g, o := fc.g, fc.o
	fc.msg, fc.chunks, fc.jsonN = fc.msg[:0], fc.chunks[:0], 0
	var idb [64]byte
	record := func(b []byte, i int) []byte {
		t := &fc.pool.tmpl[int(fc.next)%len(fc.pool.tmpl)]
		id := appendID(idb[:0], o.runID, fc.c, fc.next)
		fc.next++
		b = appendEventTime(b, now.Add(time.Duration(i)*time.Microsecond))
		b = append(b, t.packed...)
		b = msgp.AppendStringFromBytes(b, id)
		fc.jsonN += uint64(t.jsonLen(len(id)))
		return b
	}
	if g.mode == "message" {
		for i := range o.batch {
			n := uint32(3)
			if g.ack {
				n = 4
			}
			fc.msg = msgp.AppendArrayHeader(fc.msg, n)
			fc.msg = fc.appendTag(fc.msg)
			fc.msg = record(fc.msg, i)
			if g.ack {
				fc.msg = fc.option(fc.msg, 1)
			}
		}
		return
	}
	n := uint32(2)
	if g.ack {
		n = 3
	}
	fc.msg = msgp.AppendArrayHeader(fc.msg, n)
	fc.msg = fc.appendTag(fc.msg)
	var lenAt int
	if g.mode == "packed" {
		// bin32 with its length filled in below.
		fc.msg = append(fc.msg, 0xc6, 0, 0, 0, 0)
		lenAt = len(fc.msg)
	} else {
		fc.msg = append(fc.msg, 0xdd, byte(o.batch>>24), byte(o.batch>>16), byte(o.batch>>8), byte(o.batch))
	}
	for i := range o.batch {
		fc.msg = append(fc.msg, 0x92) // [time, record]
		fc.msg = record(fc.msg, i)
	}
	if g.mode == "packed" {
		l := len(fc.msg) - lenAt
		fc.msg[lenAt-4], fc.msg[lenAt-3], fc.msg[lenAt-2], fc.msg[lenAt-1] = byte(l>>24), byte(l>>16), byte(l>>8), byte(l)
	}
	if g.ack {
		fc.msg = fc.option(fc.msg, o.batch)
	}
}

// option appends {"chunk": id, "size": records} with a new chunk id.
func (fc *fwdConn) option(b []byte, records int) []byte {
	chunk := fc.o.runID + "-" + strconv.Itoa(fc.c) + "-c" + strconv.FormatUint(fc.chunk, 10)
	fc.chunk++
	fc.chunks = append(fc.chunks, chunk)
	b = msgp.AppendMapHeader(b, 2)
	b = msgp.AppendString(b, "chunk")
	b = msgp.AppendString(b, chunk)
	b = msgp.AppendString(b, "size")
	return msgp.AppendInt(b, records)
}

// send writes the message and waits for its acks. After an error, with
// -tolerate-errors, it reconnects and sends the same message again (same
// chunk ids: the forwarder stores it once) until it is acknowledged or
// the run stops; without, it reports false.
func (fc *fwdConn) send(first uint64, stop <-chan struct{}) bool {
	o, st := fc.o, fc.st
	counted := false
	for {
		if fc.nc == nil {
			nc, err := net.DialTimeout("tcp", fc.g.addr, 5*time.Second)
			if err != nil {
				st.fail(errKind("dial", err))
				if !fc.retry(stop) {
					return false
				}
				continue
			}
			fc.nc, fc.rd = nc, msgp.NewReader(bufio.NewReader(nc))
		}
		start := time.Now()
		fc.nc.SetWriteDeadline(start.Add(o.timeout))
		_, err := fc.nc.Write(fc.msg)
		if !counted && err == nil {
			counted = true
			st.sentRecords.Add(uint64(o.batch))
			st.sentMessages++
			st.sentBytes += fc.jsonN
		}
		if err != nil {
			st.fail(errKind("write", err))
		} else if fc.g.ack {
			err = fc.readAcks(start.Add(o.timeout))
		}
		if err != nil {
			fc.nc.Close()
			fc.nc = nil
			if !fc.retry(stop) {
				return false
			}
			continue
		}
		if fc.g.ack {
			st.latencies = append(st.latencies, time.Since(start))
			st.ackedRecords.Add(uint64(o.batch))
			st.ackedMsgs++
			st.ackedBytes += fc.jsonN
			fc.ids.add(first, o.batch)
		}
		return true
	}
}

// readAcks reads one ack per chunk, in order.
func (fc *fwdConn) readAcks(deadline time.Time) error {
	fc.nc.SetReadDeadline(deadline)
	for _, want := range fc.chunks {
		n, err := fc.rd.ReadMapHeader()
		if err != nil {
			fc.st.fail(errKind("ack", err))
			return err
		}
		var got string
		for range n {
			k, err := fc.rd.ReadString()
			if err != nil {
				fc.st.fail(errKind("ack", err))
				return err
			}
			if k != "ack" {
				if err := fc.rd.Skip(); err != nil {
					fc.st.fail(errKind("ack", err))
					return err
				}
				continue
			}
			if got, err = fc.rd.ReadString(); err != nil {
				fc.st.fail(errKind("ack", err))
				return err
			}
		}
		if got != want {
			fc.st.fail("ack: wrong chunk id")
			return fmt.Errorf("ack %q, want %q", got, want)
		}
	}
	return nil
}

// retry waits a little before the next attempt; false: give up.
func (fc *fwdConn) retry(stop <-chan struct{}) bool {
	if !fc.o.tolerate {
		return false
	}
	select {
	case <-stop:
		return false
	case <-time.After(200 * time.Millisecond):
		return true
	}
}
