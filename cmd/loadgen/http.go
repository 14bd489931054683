package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// httpGen POSTs NDJSON bodies to the HTTP input. A request counts as
// acknowledged only when it is answered 200. Each request carries an
// Idempotency-Key, so that one sent again after an error is stored once.
type httpGen struct {
	url     string
	clients int
	token   string
	client  *http.Client
}

func (g *httpGen) register(f *flag.FlagSet) {
	f.StringVar(&g.url, "url", "http://127.0.0.1:8080/v1/logs/pod.shop", "where to POST")
	f.IntVar(&g.clients, "clients", 8, "clients, each with one request in flight")
	f.StringVar(&g.token, "token", "", "bearer token (inputs.http.token)")
}

func (g *httpGen) check(o *options) error {
	if g.clients < 1 {
		return errors.New("-clients must be at least 1")
	}
	u, err := url.Parse(g.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("-url %q: want http://HOST:PORT/v1/logs/TAG", g.url)
	}
	g.client = &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        g.clients,
		MaxIdleConnsPerHost: g.clients,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
	}, Timeout: o.timeout}
	return nil
}

func (g *httpGen) workers() int { return g.clients }

func (g *httpGen) describe(r *result) {
	r.Mode, r.Target, r.Acks = "http", g.url, true
}

func (g *httpGen) work(c int, o *options, st *stats, stop <-chan struct{}, ids *idWriter) {
	idLen := len(o.runID) + len(strconv.Itoa(c)) + 8
	// The record's time is its "time" field (which the input reads), so
	// the log line does not repeat it.
	p := newPool(o.seed, o.seed+int64(c), 1024, o.size-len(`"time":"2006-01-02T15:04:05.000000Z",`), idLen, false)
	ib := idBuf{w: ids, run: o.runID, c: c}
	defer func() {
		if ids != nil {
			ib.flush()
		}
	}()
	var body []byte
	var next uint64
	for sent := 0; o.messages == 0 || sent < o.messages; sent++ {
		select {
		case <-stop:
			return
		default:
		}
		first := next
		var jsonN uint64
		body, jsonN = buildNDJSON(body[:0], p, o, c, &next, time.Now())
		key := o.runID + "-" + strconv.Itoa(c) + "-r" + strconv.Itoa(sent)
		if !g.post(body, key, jsonN, o, st, stop) {
			return
		}
		ib.add(first, o.batch)
	}
}

// buildNDJSON appends a batch of records, one JSON object a line, each
// with a "time" field first (RFC 3339, as a container runtime writes it).
func buildNDJSON(b []byte, p *pool, o *options, c int, next *uint64, now time.Time) ([]byte, uint64) {
	var n uint64
	for i := range o.batch {
		start := len(b)
		t := &p.tmpl[int(*next)%len(p.tmpl)]
		b = append(b, `{"time":"`...)
		b = now.Add(time.Duration(i)*time.Microsecond).UTC().AppendFormat(b, "2006-01-02T15:04:05.000000Z")
		b = append(b, `",`...)
		b = append(b, t.json...)
		b = append(b, `"id":"`...)
		b = appendID(b, o.runID, c, *next)
		b = append(b, `"}`...)
		n += uint64(len(b) - start)
		b = append(b, '\n')
		*next++
	}
	return b, n
}

// post sends one body until it is answered 200 (with -tolerate-errors)
// or once (without); false: the client stops.
func (g *httpGen) post(body []byte, key string, jsonN uint64, o *options, st *stats, stop <-chan struct{}) bool {
	counted := false
	for {
		req, err := http.NewRequest(http.MethodPost, g.url, bytes.NewReader(body))
		if err != nil {
			st.fail("request: " + err.Error())
			return false
		}
		req.Header.Set("Content-Type", "application/x-ndjson")
		req.Header.Set("Idempotency-Key", key)
		if g.token != "" {
			req.Header.Set("Authorization", "Bearer "+g.token)
		}
		if !counted {
			counted = true
			st.sentRecords.Add(uint64(o.batch))
			st.sentMessages++
			st.sentBytes += jsonN
		}
		start := time.Now()
		resp, err := g.client.Do(req)
		if err == nil {
			var answer []byte
			answer, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			if err == nil {
				if resp.StatusCode == http.StatusOK {
					if n := storedCount(answer); n != o.batch {
						st.fail("http: 200 with stored != batch")
					} else {
						st.latencies = append(st.latencies, time.Since(start))
						st.ackedRecords.Add(uint64(o.batch))
						st.ackedMsgs++
						st.ackedBytes += jsonN
						return true
					}
				} else {
					st.fail("http: status " + strconv.Itoa(resp.StatusCode))
				}
			} else {
				st.fail(errKind("http", err))
			}
		} else {
			st.fail(errKind("http", err))
		}
		if !o.tolerate {
			return false
		}
		select {
		case <-stop:
			return false
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// storedCount reads {"stored": N, "unrouted": M}: N, or -1.
func storedCount(answer []byte) int {
	var a struct {
		Stored   *int `json:"stored"`
		Unrouted int  `json:"unrouted"`
	}
	if json.Unmarshal(answer, &a) != nil || a.Stored == nil {
		return -1
	}
	return *a.Stored
}
