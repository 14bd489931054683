package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tinylib/msgp/msgp"
)

// gotMessage is one forward message the test server decoded.
type gotMessage struct {
	mode    string // packed, forward or message
	tag     string
	chunk   string
	size    int64 // option.size, -1 if absent
	records []gotRecord
}

type gotRecord struct {
	sec, nsec uint32
	json      []byte         // the record as JSON, keys in order
	fields    map[string]any // the record decoded
}

// fwdServer is a forward protocol server for the tests: it decodes each
// message with msgp and, if it carries a chunk, acks it — unless hook
// says otherwise.
type fwdServer struct {
	t  *testing.T
	ln net.Listener

	mu   sync.Mutex
	msgs []gotMessage
	// hook, if set, is called for each message before its ack: it returns
	// the chunk id to ack (normally m.chunk), or "" to close the
	// connection without an ack.
	hook func(m gotMessage) string
	wg   sync.WaitGroup
}

func newFwdServer(t *testing.T) *fwdServer {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fwdServer{t: t, ln: ln}
	s.wg.Go(func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			s.wg.Go(func() { s.serve(nc) })
		}
	})
	t.Cleanup(func() { ln.Close(); s.wg.Wait() })
	return s
}

func (s *fwdServer) addr() string { return s.ln.Addr().String() }

func (s *fwdServer) messages() []gotMessage {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.msgs)
}

func (s *fwdServer) serve(nc net.Conn) {
	defer nc.Close()
	r := msgp.NewReader(bufio.NewReader(nc))
	for {
		var raw msgp.Raw
		if err := raw.DecodeMsg(r); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
				s.t.Errorf("read message: %v", err)
			}
			return
		}
		m, err := decodeForward(raw)
		if err != nil {
			s.t.Errorf("decode message: %v", err)
			return
		}
		s.mu.Lock()
		s.msgs = append(s.msgs, m)
		hook := s.hook
		s.mu.Unlock()
		ack := m.chunk
		if hook != nil {
			ack = hook(m)
			if ack == "" {
				return
			}
		}
		if m.chunk != "" {
			b := msgp.AppendMapHeader(nil, 1)
			b = msgp.AppendString(b, "ack")
			b = msgp.AppendString(b, ack)
			if _, err := nc.Write(b); err != nil {
				return
			}
		}
	}
}

// decodeForward decodes [tag, entries|packed|time, (record,) option?].
func decodeForward(b []byte) (gotMessage, error) {
	m := gotMessage{size: -1}
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil {
		return m, err
	}
	if m.tag, b, err = msgp.ReadStringBytes(b); err != nil {
		return m, err
	}
	left := n - 2
	switch msgp.NextType(b) {
	case msgp.BinType:
		m.mode = "packed"
		var packed []byte
		if packed, b, err = msgp.ReadBytesZC(b); err != nil {
			return m, err
		}
		for len(packed) > 0 {
			var rec gotRecord
			if rec, packed, err = decodeEntry(packed); err != nil {
				return m, err
			}
			m.records = append(m.records, rec)
		}
	case msgp.ArrayType:
		m.mode = "forward"
		var count uint32
		if count, b, err = msgp.ReadArrayHeaderBytes(b); err != nil {
			return m, err
		}
		for range count {
			var rec gotRecord
			if rec, b, err = decodeEntry(b); err != nil {
				return m, err
			}
			m.records = append(m.records, rec)
		}
	default:
		m.mode = "message"
		var rec gotRecord
		if rec, b, err = decodeTimeRecord(b); err != nil {
			return m, err
		}
		m.records = append(m.records, rec)
		left--
	}
	if left == 1 {
		var opt map[string]any
		if opt, b, err = msgp.ReadMapStrIntfBytes(b, nil); err != nil {
			return m, fmt.Errorf("option: %w", err)
		}
		m.chunk, _ = opt["chunk"].(string)
		if sz, ok := opt["size"].(int64); ok {
			m.size = sz
		}
	}
	if len(b) != 0 {
		return m, fmt.Errorf("%d bytes left over", len(b))
	}
	return m, nil
}

func decodeEntry(b []byte) (gotRecord, []byte, error) {
	n, b, err := msgp.ReadArrayHeaderBytes(b)
	if err != nil || n != 2 {
		return gotRecord{}, b, fmt.Errorf("entry: %d elements, %v", n, err)
	}
	return decodeTimeRecord(b)
}

// decodeTimeRecord reads an EventTime (fixext8, type 0) and a record.
func decodeTimeRecord(b []byte) (gotRecord, []byte, error) {
	var rec gotRecord
	if len(b) < 10 || b[0] != 0xd7 || b[1] != 0x00 {
		return rec, b, fmt.Errorf("time is not an EventTime: % x", b[:min(len(b), 10)])
	}
	rec.sec, rec.nsec = binary.BigEndian.Uint32(b[2:]), binary.BigEndian.Uint32(b[6:])
	b = b[10:]
	rest, err := msgp.Skip(b)
	if err != nil {
		return rec, b, err
	}
	raw := b[:len(b)-len(rest)]
	var js bytes.Buffer
	if _, err := msgp.UnmarshalAsJSON(&js, raw); err != nil {
		return rec, b, err
	}
	rec.json = js.Bytes()
	if rec.fields, _, err = msgp.ReadMapStrIntfBytes(raw, nil); err != nil {
		return rec, b, err
	}
	return rec, rest, nil
}

// runLoadgen runs the command and returns its exit code and its -json result.
func runLoadgen(t *testing.T, args ...string) (int, *result, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), append(args, "-json"), &out, &errb)
	var r result
	if out.Len() > 0 {
		if err := json.Unmarshal(out.Bytes(), &r); err != nil {
			t.Fatalf("output %q: %v", out.String(), err)
		}
	}
	return code, &r, errb.String()
}

func readIDs(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

// checkRecord checks a record's shape: its fields, its id and its size.
func checkRecord(t *testing.T, rec gotRecord, size int) string {
	t.Helper()
	keys := []string{}
	for _, k := range []string{"log", "stream", "kubernetes", "id"} {
		if _, ok := rec.fields[k]; !ok {
			t.Fatalf("record %s has no %q", rec.json, k)
		}
		keys = append(keys, k)
	}
	if len(rec.fields) != len(keys) {
		t.Fatalf("record %s: want exactly the fields %v", rec.json, keys)
	}
	k8s, ok := rec.fields["kubernetes"].(map[string]any)
	if !ok || !slices.Contains(namespaces, k8s["namespace_name"].(string)) || k8s["pod_name"] == "" {
		t.Fatalf("record %s: bad kubernetes metadata", rec.json)
	}
	line := rec.fields["log"].(string)
	for _, part := range []string{"status=", "latency_ms=", "request_id=", "/"} {
		if !strings.Contains(line, part) {
			t.Fatalf("log line %q has no %q", line, part)
		}
	}
	if _, err := time.Parse("2006-01-02T15:04:05.000000Z", strings.Fields(line)[0]); err != nil {
		t.Fatalf("log line %q does not start with a timestamp: %v", line, err)
	}
	if s := rec.fields["stream"]; s != "stdout" && s != "stderr" {
		t.Fatalf("stream %v", s)
	}
	if !json.Valid(rec.json) {
		t.Fatalf("record is not valid JSON: %s", rec.json)
	}
	if len(rec.json) < size-12 || len(rec.json) > size+12 {
		t.Fatalf("record of %d bytes of JSON, want about %d: %s", len(rec.json), size, rec.json)
	}
	if age := time.Since(time.Unix(int64(rec.sec), int64(rec.nsec))); age < -time.Second || age > time.Minute {
		t.Fatalf("event time %v ago", age)
	}
	return rec.fields["id"].(string)
}

func TestForwardPackedWithAcks(t *testing.T) {
	s := newFwdServer(t)
	ids := filepath.Join(t.TempDir(), "ids")
	const conns, msgs, batch, size = 3, 4, 50, 250
	code, r, stderr := runLoadgen(t, "forward", "-addr", s.addr(), "-conns", fmt.Sprint(conns), "-batch", fmt.Sprint(batch),
		"-size", fmt.Sprint(size), "-messages", fmt.Sprint(msgs), "-duration", "0", "-run", "t1", "-ids", ids)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	got := s.messages()
	if len(got) != conns*msgs {
		t.Fatalf("server got %d messages, want %d", len(got), conns*msgs)
	}
	chunks := map[string]bool{}
	seen := map[string]bool{}
	pods := map[string]bool{}
	var jsonBytes int
	for _, m := range got {
		if m.mode != "packed" || m.tag != "pod.shop" || len(m.records) != batch || m.size != batch {
			t.Fatalf("message: mode %s, tag %s, %d records, size option %d", m.mode, m.tag, len(m.records), m.size)
		}
		if !strings.HasPrefix(m.chunk, "t1-") || chunks[m.chunk] {
			t.Fatalf("chunk id %q: not from the run or not unique", m.chunk)
		}
		chunks[m.chunk] = true
		for _, rec := range m.records {
			id := checkRecord(t, rec, size)
			if !strings.HasPrefix(id, "t1-") || seen[id] {
				t.Fatalf("record id %q: not from the run or not unique", id)
			}
			seen[id] = true
			jsonBytes += len(rec.json)
			pods[rec.fields["kubernetes"].(map[string]any)["pod_name"].(string)] = true
		}
	}
	// All connections send logs of the same few dozen pods.
	if len(pods) < 10 || len(pods) > 39 {
		t.Fatalf("records of %d pods, want a few dozen at most", len(pods))
	}
	// Every connection numbers its records from 0.
	for c := range conns {
		for n := range msgs * batch {
			if id := fmt.Sprintf("t1-%d-%d", c, n); !seen[id] {
				t.Fatalf("no record %s", id)
			}
		}
	}
	want := uint64(conns * msgs * batch)
	if r.SentRecords != want || r.AckedRecords != want || r.AckedMessages != conns*msgs || r.errorCount() != 0 {
		t.Fatalf("result %+v, want %d records sent and acknowledged", r, want)
	}
	if r.AckedBytes != uint64(jsonBytes) {
		t.Fatalf("result counts %d bytes of JSON, the records have %d", r.AckedBytes, jsonBytes)
	}
	if r.P50ms <= 0 || r.P99ms < r.P50ms || r.RecordsPerSec <= 0 || r.MBPerSec <= 0 {
		t.Fatalf("result %+v: missing rates or latencies", r)
	}
	lines := readIDs(t, ids)
	if len(lines) != len(seen) {
		t.Fatalf("ids file has %d lines, want %d", len(lines), len(seen))
	}
	for _, id := range lines {
		if !seen[id] {
			t.Fatalf("ids file has %q, which was not sent", id)
		}
		delete(seen, id)
	}
}

func TestForwardModes(t *testing.T) {
	for _, mode := range []string{"forward", "message"} {
		t.Run(mode, func(t *testing.T) {
			s := newFwdServer(t)
			code, r, stderr := runLoadgen(t, "forward", "-addr", s.addr(), "-conns", "2", "-batch", "7", "-size", "400",
				"-messages", "3", "-duration", "0", "-mode", mode, "-tag", "pod.payments")
			if code != 0 {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			got := s.messages()
			wantMsgs := 2 * 3
			if mode == "message" {
				wantMsgs *= 7 // one record a message
			}
			if len(got) != wantMsgs {
				t.Fatalf("server got %d messages, want %d", len(got), wantMsgs)
			}
			records := 0
			for _, m := range got {
				if m.mode != mode || m.tag != "pod.payments" || m.chunk == "" {
					t.Fatalf("message %s %s chunk %q", m.mode, m.tag, m.chunk)
				}
				for _, rec := range m.records {
					checkRecord(t, rec, 400)
					records++
				}
			}
			if records != 42 || r.AckedRecords != 42 || r.SentRecords != 42 {
				t.Fatalf("%d records arrived, result %+v; want 42", records, r)
			}
		})
	}
}

func TestForwardWithoutAcks(t *testing.T) {
	s := newFwdServer(t)
	code, r, stderr := runLoadgen(t, "forward", "-addr", s.addr(), "-conns", "2", "-batch", "10", "-messages", "5", "-duration", "0", "-ack=false")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if r.SentRecords != 100 || r.AckedRecords != 0 || r.Acks || r.RecordsPerSec <= 0 {
		t.Fatalf("result %+v", r)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(s.messages()) < 10 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	for _, m := range s.messages() {
		if m.chunk != "" || m.size != -1 {
			t.Fatalf("message without acks has options: chunk %q", m.chunk)
		}
	}
	if n := len(s.messages()); n != 10 {
		t.Fatalf("server got %d messages, want 10", n)
	}
}

func TestForwardDuration(t *testing.T) {
	s := newFwdServer(t)
	start := time.Now()
	code, r, stderr := runLoadgen(t, "forward", "-addr", s.addr(), "-conns", "2", "-batch", "100", "-duration", "300ms")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if el := time.Since(start); el < 300*time.Millisecond || el > 10*time.Second {
		t.Fatalf("ran %v for -duration 300ms", el)
	}
	if r.AckedRecords == 0 || r.AckedRecords != uint64(len(s.messages())*100) {
		t.Fatalf("acknowledged %d records, the server got %d messages", r.AckedRecords, len(s.messages()))
	}
}

func TestForwardServerClosesWithoutAck(t *testing.T) {
	s := newFwdServer(t)
	s.hook = func(gotMessage) string { return "" }
	code, r, _ := runLoadgen(t, "forward", "-addr", s.addr(), "-conns", "1", "-batch", "10", "-messages", "3", "-duration", "0")
	if code != 1 {
		t.Fatalf("exit %d, want 1", code)
	}
	if r.AckedRecords != 0 || r.SentRecords != 10 || r.RecordsPerSec != 0 || r.Errors["ack: closed by the server"] != 1 {
		t.Fatalf("result %+v", r)
	}
}

func TestForwardWrongAck(t *testing.T) {
	s := newFwdServer(t)
	s.hook = func(gotMessage) string { return "something-else" }
	code, r, _ := runLoadgen(t, "forward", "-addr", s.addr(), "-conns", "1", "-batch", "10", "-messages", "3", "-duration", "0")
	if code != 1 || r.Errors["ack: wrong chunk id"] != 1 || r.AckedRecords != 0 {
		t.Fatalf("exit %d, result %+v", code, r)
	}
}

// With -tolerate-errors, a message whose ack was lost is sent again with
// the same chunk id and records, and counted once.
func TestForwardTolerateErrorsResends(t *testing.T) {
	s := newFwdServer(t)
	var mu sync.Mutex
	dropped := map[string]bool{}
	s.hook = func(m gotMessage) string {
		mu.Lock()
		defer mu.Unlock()
		if !dropped[m.chunk] && len(dropped) < 2 {
			dropped[m.chunk] = true
			return "" // close without an ack
		}
		return m.chunk
	}
	ids := filepath.Join(t.TempDir(), "ids")
	code, r, stderr := runLoadgen(t, "forward", "-addr", s.addr(), "-conns", "1", "-batch", "10", "-messages", "4",
		"-duration", "0", "-tolerate-errors", "-ids", ids)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	got := s.messages()
	if len(got) != 6 {
		t.Fatalf("server got %d messages, want 4 and 2 sent again", len(got))
	}
	if got[0].chunk != got[1].chunk || got[0].records[0].fields["id"] != got[1].records[0].fields["id"] {
		t.Fatalf("the message sent again differs: %q, %q", got[0].chunk, got[1].chunk)
	}
	if r.AckedRecords != 40 || r.SentRecords != 40 || r.Errors["ack: closed by the server"] != 2 {
		t.Fatalf("result %+v", r)
	}
	if n := len(readIDs(t, ids)); n != 40 {
		t.Fatalf("ids file has %d ids, want 40", n)
	}
}

func TestForwardRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	code, r, _ := runLoadgen(t, "forward", "-addr", addr, "-conns", "2", "-messages", "1", "-duration", "0")
	if code != 1 || r.Errors["dial: refused"] != 2 {
		t.Fatalf("exit %d, result %+v", code, r)
	}
}

func TestUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"udp"},
		{"forward", "-mode", "compressed"},
		{"forward", "-conns", "0"},
		{"forward", "-batch", "0"},
		{"forward", "-duration", "0"},
		{"forward", "-ack=false", "-ids", "x"},
		{"forward", "extra"},
		{"http", "-url", "ftp://x"},
		{"http", "-clients", "0"},
	} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb); code != 2 {
			t.Errorf("loadgen %q: exit %d, want 2", args, code)
		}
	}
}

func TestPoolRecords(t *testing.T) {
	for _, size := range []int{50, 250, 1000, 4096} {
		p := newPool(7, 7, 200, size, 12, true)
		for _, tm := range p.tmpl {
			js := append(append([]byte("{"), tm.json...), `"id":"abcdef-1-123"}`...)
			if !json.Valid(js) {
				t.Fatalf("size %d: invalid JSON %s", size, js)
			}
			if len(js) != tm.jsonLen(12) || (size >= 400 && len(js) != size) {
				t.Fatalf("size %d: record of %d bytes: %s", size, len(js), js)
			}
			v, rest, err := msgp.ReadMapStrIntfBytes(msgp.AppendString(slices.Clone(tm.packed), "abcdef-1-123"), nil)
			if err != nil || len(rest) != 0 || len(v) != 4 {
				t.Fatalf("size %d: msgpack record %v: %v", size, v, err)
			}
		}
	}
	// The pods: a few dozen across a handful of namespaces.
	p := newPool(1, 1, 5000, 250, 12, true)
	pods := map[string]bool{}
	nss := map[string]bool{}
	for _, tm := range p.tmpl {
		var v struct {
			K struct {
				NS  string `json:"namespace_name"`
				Pod string `json:"pod_name"`
			} `json:"kubernetes"`
		}
		if err := json.Unmarshal(append(append([]byte("{"), tm.json...), `"id":"x"}`...), &v); err != nil {
			t.Fatal(err)
		}
		pods[v.K.NS+"/"+v.K.Pod] = true
		nss[v.K.NS] = true
	}
	if len(nss) != len(namespaces) || len(pods) < 24 || len(pods) > 48 {
		t.Fatalf("%d namespaces, %d pods", len(nss), len(pods))
	}
}

// -tags spreads each connection's messages over the tags in turn.
func TestForwardTags(t *testing.T) {
	s := newFwdServer(t)
	code, _, stderr := runLoadgen(t, "forward", "-addr", s.addr(), "-conns", "2", "-batch", "5", "-messages", "6", "-duration", "0", "-tag", "pod.x", "-tags", "3")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	tags := map[string]int{}
	for _, m := range s.messages() {
		tags[m.tag]++
	}
	if len(tags) != 3 || tags["pod.x.0"] != 4 || tags["pod.x.1"] != 4 || tags["pod.x.2"] != 4 {
		t.Fatalf("messages by tag %v, want 4 each of pod.x.0, pod.x.1, pod.x.2", tags)
	}
}

// -rate paces the connections: about rate records a second in all, not
// as many as the acks allow.
func TestForwardRate(t *testing.T) {
	srv := newFwdServer(t)
	start := time.Now()
	code, res, stderr := runLoadgen(t, "forward", "-addr", srv.addr(), "-conns", "4", "-batch", "10", "-size", "50",
		"-duration", "2s", "-rate", "2000")
	took := time.Since(start).Seconds()
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	got := 0
	for _, m := range srv.messages() {
		got += len(m.records)
	}
	if rate := float64(got) / took; rate > 2200 || rate < 1500 {
		t.Errorf("%d records in %.2f s: %.0f a second, want about 2,000 (result %+v)", got, took, rate, res)
	}
}

// The connections start spread over the tags: the first messages of 4
// connections over 100 tags go to 4 tags a quarter apart, so that every
// tag gets messages from the start, not only the first ones.
func TestForwardTagsSpread(t *testing.T) {
	s := newFwdServer(t)
	code, _, stderr := runLoadgen(t, "forward", "-addr", s.addr(), "-conns", "4", "-batch", "1", "-messages", "1", "-duration", "0", "-tag", "t", "-tags", "100")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var got []string
	for _, m := range s.messages() {
		got = append(got, m.tag)
	}
	slices.Sort(got)
	if want := []string{"t.0", "t.25", "t.50", "t.75"}; !slices.Equal(got, want) {
		t.Errorf("first tags %v, want %v", got, want)
	}
}
