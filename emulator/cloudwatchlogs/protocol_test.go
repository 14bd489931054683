package cloudwatchlogs

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

const jsonType = "application/x-amz-json-1.1"

func TestProtocolErrors(t *testing.T) {
	e := newEnv(t, Options{})
	for _, c := range []struct {
		name, target, ctype, body string
		sign                      bool
		status                    int
		code                      string
	}{
		{"no Authorization", "Logs_20140328.DescribeLogGroups", jsonType, `{}`, false, 403, "MissingAuthenticationTokenException"},
		{"no target", "", jsonType, `{}`, true, 400, "UnknownOperationException"},
		{"other service", "DynamoDB_20120810.ListTables", jsonType, `{}`, true, 400, "UnknownOperationException"},
		{"unsupported operation", "Logs_20140328.StartQuery", jsonType, `{}`, true, 400, "UnknownOperationException"},
		{"wrong content type", "Logs_20140328.DescribeLogGroups", "application/json", `{}`, true, 400, "SerializationException"},
		{"bad JSON", "Logs_20140328.CreateLogGroup", jsonType, `{"logGroupName":`, true, 400, "SerializationException"},
		{"wrong JSON type", "Logs_20140328.CreateLogGroup", jsonType, `{"logGroupName":5}`, true, 400, "SerializationException"},
		{"missing member", "Logs_20140328.CreateLogGroup", jsonType, `{}`, true, 400, "InvalidParameterException"},
		{"missing group", "Logs_20140328.CreateLogStream", jsonType, `{"logGroupName":"nope","logStreamName":"s"}`, true, 400, "ResourceNotFoundException"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := raw(t, e.url, c.target, c.ctype, c.body, c.sign)
			if r.status != c.status || r.body["__type"] != c.code {
				t.Fatalf("%d %s, want %d %s", r.status, r.text, c.status, c.code)
			}
			if got := r.header.Get("x-amzn-ErrorType"); got != c.code {
				t.Errorf("x-amzn-ErrorType = %q, want %q", got, c.code)
			}
			if msg, _ := r.body["message"].(string); msg == "" {
				t.Errorf("no message in %s", r.text)
			}
			if r.header.Get("Content-Type") != jsonType || r.header.Get("x-amzn-RequestId") == "" {
				t.Errorf("headers %v", r.header)
			}
		})
	}
	r := raw(t, e.url, "Logs_20140328.CreateLogGroup", jsonType+"; charset=utf-8", `{"logGroupName":"g","unknownMember":1}`, true)
	if r.status != 200 || r.text != "" || r.header.Get("Content-Type") != jsonType {
		t.Errorf("CreateLogGroup: %d %q %v", r.status, r.text, r.header)
	}
	r = raw(t, e.url, "Logs_20140328.DescribeLogGroups", jsonType, ``, true)
	if r.status != 200 || r.body["logGroups"] == nil {
		t.Errorf("DescribeLogGroups with an empty body: %d %s", r.status, r.text)
	}
	r = raw(t, e.url, "Logs_20140328.CreateLogGroup", jsonType, `{"logGroupName":"g"}`, true)
	if want := `{"__type":"ResourceAlreadyExistsException","message":"The specified log group already exists"}`; r.text != want {
		t.Errorf("body %s, want %s", r.text, want)
	}

	for op, n := range map[string]int{"DescribeLogGroups": 3, "CreateLogGroup": 5, "CreateLogStream": 1, "StartQuery": 1, "": 2, "PutLogEvents": 0} {
		if got := e.srv.Calls(op); got != n {
			t.Errorf("Calls(%q) = %d, want %d", op, got, n)
		}
	}
}

// The Server is a plain http.Handler too.
func TestServeHTTPWithoutStart(t *testing.T) {
	srv := New(Options{})
	body := `{"logGroupName":"g"}`
	req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body))
	req.Header.Set("X-Amz-Target", "Logs_20140328.CreateLogGroup")
	req.Header.Set("Content-Type", jsonType)
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 anything")
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	if rec.Code != 200 || len(srv.Groups()) != 1 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	if err := srv.Close(); err != nil {
		t.Fatal(err)
	}
	rec = httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body)))
	if rec.Code != 503 || !strings.Contains(rec.Body.String(), "ServiceUnavailableException") {
		t.Errorf("after Close: %d %s", rec.Code, rec.Body)
	}
	if got := fmt.Sprint(srv.Calls("CreateLogGroup")); got != "1" {
		t.Errorf("Calls = %s", got)
	}
}
