package admin

import (
	"bufio"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/logfwd/forwarder/queue"
)

// walStats serves the WAL's statistics (wal.Stats as JSON), what
// `forwarder wal stats` prints of a running service.
func (s *Server) walStats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.src.WAL.Stats())
}

// Dead letters an answer holds at most: a request may ask for fewer.
const (
	maxDeadLetters     = 10000    // per sink, as many as a sink keeps
	defaultDeadLetters = 100      // per sink, without ?limit
	maxDeadLetterBytes = 16 << 20 // in all: the newest that fit; the header says how many were left out
)

// deadLetters serves the dead letters, one JSON object a line, oldest
// first, as `forwarder wal dead-letters` prints them: of every sink with a
// cursor, or of ?sink=NAME; the newest ?limit=N of each sink (default 100,
// at most 10,000), within 16 MiB in all. Dead-Letters-Omitted counts those
// that the byte bound left out. They are copied out of the WAL before the
// answer is written: a slow client must not hold a read transaction open.
func (s *Server) deadLetters(w http.ResponseWriter, r *http.Request) {
	if !fromThisMachine(r) || !s.hasToken(r) {
		writeJSON(w, http.StatusForbidden, map[string]string{"error": "dead letters hold the records' content: they are served to this machine's own addresses only, with the token the service writes to data_dir/" + TokenFileName + " (run forwarder wal dead-letters where the service runs, in its pod with kubectl exec, as a user who can read its data_dir)"})
		return
	}
	names := slices.Sorted(maps.Keys(s.src.WAL.Stats().Cursors))
	if sink := r.URL.Query().Get("sink"); sink != "" {
		if !slices.Contains(names, sink) {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf("the WAL has no sink %q (it has: %v)", sink, names)})
			return
		}
		names = []string{sink}
	}
	limit := defaultDeadLetters
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxDeadLetters {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": fmt.Sprintf("limit %q is not a number from 1 to %d", v, maxDeadLetters)})
			return
		}
		limit = n
	}
	var lines [][]byte
	omitted, damaged := 0, 0
	for _, name := range names {
		var of [][]byte
		held := 0
		if err := queue.DeadLetters(s.src.WAL, name, func(d queue.DeadLetter) error {
			b, err := json.Marshal(struct {
				Sink string `json:"sink"`
				queue.DeadLetter
			}{name, d})
			if err != nil {
				return err
			}
			of, held = append(of, b), held+len(b)+1
			for len(of) > limit || held > maxDeadLetterBytes {
				if len(of) <= limit {
					omitted++
				}
				held -= len(of[0]) + 1
				of = of[1:]
			}
			return nil
		}); err != nil {
			var bad *queue.DamagedDeadLettersError
			if !errors.As(err, &bad) {
				writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
				return
			}
			damaged += bad.Count // the others are listed
			s.log.Warn("listing dead letters: "+err.Error(), "sink", name)
		}
		lines = append(lines, of...)
	}
	// The newest that fit in maxDeadLetterBytes, in their order.
	size, from := 0, len(lines)
	for from > 0 && size+len(lines[from-1])+1 <= maxDeadLetterBytes {
		from--
		size += len(lines[from]) + 1
	}
	omitted += from
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("Dead-Letters-Omitted", strconv.Itoa(omitted))
	if damaged > 0 {
		w.Header().Set("Dead-Letters-Damaged", strconv.Itoa(damaged))
	}
	out := bufio.NewWriter(w)
	for _, l := range lines[from:] {
		out.Write(l)
		out.WriteByte('\n')
	}
	out.Flush()
}

// TokenFileName is the file in data_dir that holds the admin token
// (Sources.TokenFile).
const TokenFileName = "admin.token"

// hasToken reports whether r carries the server's token, when it has one:
// a proxy on the machine (a mesh's sidecar) may pass other pods' requests
// from an address that looks local; it cannot pass the token.
func (s *Server) hasToken(r *http.Request) bool {
	if s.token == "" {
		return true
	}
	scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	return ok && strings.EqualFold(scheme, "Bearer") && subtle.ConstantTimeCompare([]byte(got), []byte(s.token)) == 1
}

// fromThisMachine reports whether r comes from the machine the server runs
// on (or its pod): from a loopback address to a loopback address, or from
// the very address it reached (admin.listen on one of the machine's
// addresses). A loopback source that reached another address is a proxy
// on the machine passing traffic from elsewhere (a service mesh's sidecar
// connects from 127.0.0.6 to the pod's address): refused.
func fromThisMachine(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	ip := net.ParseIP(host)
	la, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr)
	if err != nil || ip == nil || !ok {
		return false
	}
	return ip.IsLoopback() && la.IP.IsLoopback() || la.IP.Equal(ip)
}
