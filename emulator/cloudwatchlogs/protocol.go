package cloudwatchlogs

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"
	"time"
)

const (
	targetPrefix = "Logs_20140328."
	contentType  = "application/x-amz-json-1.1"
	maxBodyBytes = 16 << 20
)

// apiError is an error answered in the awsJson1.1 shape:
// {"__type": Code, "message": Message, ...Extra} with header x-amzn-ErrorType.
type apiError struct {
	Status  int
	Code    string
	Message string
	Extra   map[string]any
}

func (e *apiError) Error() string { return e.Code + ": " + e.Message }

func clientErr(code, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Code: code, Message: fmt.Sprintf(format, args...)}
}

func invalidParam(format string, args ...any) *apiError {
	return clientErr("InvalidParameterException", format, args...)
}

// validation is AWS's wording for a request member that breaks the model's
// constraints.
func validation(value any, path, constraint string) *apiError {
	var v string
	switch x := value.(type) {
	case nil:
		return invalidParam("1 validation error detected: Value null at '%s' failed to satisfy constraint: %s", path, constraint)
	case string:
		v = x
	default:
		v = fmt.Sprint(x)
	}
	return invalidParam("1 validation error detected: Value '%s' at '%s' failed to satisfy constraint: %s", v, path, constraint)
}

func notNull(path string) *apiError {
	return validation(nil, path, "Member must not be null")
}

func groupNotFound() *apiError {
	return clientErr("ResourceNotFoundException", "The specified log group does not exist.")
}

func streamNotFound() *apiError {
	return clientErr("ResourceNotFoundException", "The specified log stream does not exist.")
}

func badNextToken() *apiError {
	return invalidParam("The specified nextToken is invalid.")
}

// denyStatus is the status AWS uses for an authentication or authorisation
// error code: CloudWatch Logs models AccessDeniedException and
// UnrecognizedClientException as 400 errors; the common errors of the AWS
// APIs (MissingAuthenticationToken, ExpiredToken, InvalidClientTokenId,
// IncompleteSignature, ...) are 403.
func denyStatus(code string) (int, string) {
	switch code {
	case "AccessDeniedException":
		return http.StatusBadRequest, "User is not authorized to perform this action"
	case "UnrecognizedClientException":
		return http.StatusBadRequest, "The security token included in the request is invalid."
	case "ThrottlingException":
		return http.StatusBadRequest, "Rate exceeded"
	case "MissingAuthenticationTokenException":
		return http.StatusForbidden, "Missing Authentication Token"
	case "ExpiredTokenException":
		return http.StatusForbidden, "The security token included in the request is expired"
	}
	return http.StatusForbidden, "Access denied"
}

type handlerFunc func(s *Server, body []byte) (any, *apiError)

var operations = map[string]handlerFunc{
	"CreateLogGroup":        (*Server).createLogGroup,
	"CreateLogStream":       (*Server).createLogStream,
	"DeleteLogGroup":        (*Server).deleteLogGroup,
	"DeleteLogStream":       (*Server).deleteLogStream,
	"DescribeLogGroups":     (*Server).describeLogGroups,
	"DescribeLogStreams":    (*Server).describeLogStreams,
	"PutRetentionPolicy":    (*Server).putRetentionPolicy,
	"DeleteRetentionPolicy": (*Server).deleteRetentionPolicy,
	"PutLogEvents":          (*Server).putLogEvents,
	"GetLogEvents":          (*Server).getLogEvents,
	"FilterLogEvents":       (*Server).filterLogEvents,
}

// ServeHTTP answers one awsJson1.1 request: POST / with
// X-Amz-Target: Logs_20140328.<Operation>.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.lifeMu.RLock()
	if s.closed {
		s.lifeMu.RUnlock()
		writeError(w, s.requestID(), &apiError{Status: http.StatusServiceUnavailable, Code: "ServiceUnavailableException", Message: "The service is shutting down."})
		return
	}
	s.inflight.Add(1)
	s.lifeMu.RUnlock()
	defer s.inflight.Done()

	target := r.Header.Get("X-Amz-Target")
	op, ok := strings.CutPrefix(target, targetPrefix)
	if !ok {
		op = ""
	}
	s.countCall(op)
	reqID := s.requestID()

	s.swMu.Lock()
	latency := s.latency
	deny := s.denyCode
	fail := s.failRate > 0 && s.rng.Float64() < s.failRate
	failStatus := s.failStatus
	s.swMu.Unlock()

	if latency > 0 {
		t := time.NewTimer(latency)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		case <-s.closing:
			t.Stop()
			writeError(w, reqID, &apiError{Status: http.StatusServiceUnavailable, Code: "ServiceUnavailableException", Message: "The service is shutting down."})
			return
		}
	}

	if r.Header.Get("Authorization") == "" {
		status, msg := denyStatus("MissingAuthenticationTokenException")
		writeError(w, reqID, &apiError{Status: status, Code: "MissingAuthenticationTokenException", Message: msg})
		return
	}
	if deny != "" {
		status, msg := denyStatus(deny)
		writeError(w, reqID, &apiError{Status: status, Code: deny, Message: msg})
		return
	}
	if fail {
		e := &apiError{Status: failStatus, Code: "InternalFailure", Message: "The request processing has failed because of an unknown error, exception or failure."}
		if failStatus == http.StatusServiceUnavailable {
			e.Code, e.Message = "ServiceUnavailableException", "The service cannot complete the request."
		}
		writeError(w, reqID, e)
		return
	}

	if r.Method != http.MethodPost {
		writeError(w, reqID, clientErr("UnknownOperationException", "Only POST requests are supported."))
		return
	}
	handler, known := operations[op]
	if !known {
		msg := "Missing or unknown X-Amz-Target header " + quote(target) + "."
		if op != "" {
			msg = "Operation " + op + " is not supported by this emulator."
		}
		writeError(w, reqID, clientErr("UnknownOperationException", "%s", msg))
		return
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != contentType {
		writeError(w, reqID, clientErr("SerializationException", "Content-Type must be %s.", contentType))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeError(w, reqID, &apiError{Status: http.StatusRequestEntityTooLarge, Code: "RequestEntityTooLargeException", Message: "Request entity too large."})
		}
		return // the client went away
	}
	if !s.allow(op) {
		s.countThrottled(op)
		writeError(w, reqID, clientErr("ThrottlingException", "Rate exceeded"))
		return
	}

	out, apiErr := handler(s, body)

	if op == "PutLogEvents" {
		s.swMu.Lock()
		drop := s.dropRate > 0 && s.rng.Float64() < s.dropRate
		s.swMu.Unlock()
		if drop {
			dropConnection(w)
			return
		}
	}
	if apiErr != nil {
		writeError(w, reqID, apiErr)
		return
	}
	writeJSON(w, reqID, http.StatusOK, out)
}

func quote(s string) string {
	if s == "" {
		return "(none)"
	}
	return "'" + s + "'"
}

func (s *Server) requestID() string {
	n := s.requestIDs.Add(1)
	return fmt.Sprintf("%08x-0000-4000-8000-%012x", uint32(n>>48), n&0xffffffffffff)
}

// dropConnection closes the connection without writing a response.
func dropConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err == nil {
		conn.Close()
		return
	}
	panic(http.ErrAbortHandler) // HTTP/2 or a writer that cannot hijack
}

func writeJSON(w http.ResponseWriter, reqID string, status int, v any) {
	var body []byte
	if v != nil {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			writeError(w, reqID, &apiError{Status: 500, Code: "InternalFailure", Message: err.Error()})
			return
		}
		body = bytes.TrimRight(buf.Bytes(), "\n")
	}
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("x-amzn-RequestId", reqID)
	h.Set("Content-Length", fmt.Sprint(len(body)))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeError(w http.ResponseWriter, reqID string, e *apiError) {
	m := map[string]any{"__type": e.Code, "message": e.Message}
	for k, v := range e.Extra {
		m[k] = v
	}
	w.Header().Set("x-amzn-ErrorType", e.Code)
	writeJSON(w, reqID, e.Status, m)
}

// decode reads a request body into v; an empty body counts as {}.
func decode(body []byte, v any) *apiError {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	if err := json.Unmarshal(body, v); err != nil {
		return clientErr("SerializationException", "Could not parse the request body: %v", err)
	}
	return nil
}
