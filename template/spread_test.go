package template

import (
	"fmt"
	"strings"
	"testing"
)

func TestSpread(t *testing.T) {
	group, _ := Parse("/eks/${record.ns}", Options{})
	stream, _ := Parse("${tag[1]}-${record.pod|none}", Options{})
	ts := []Named{{Key: "log_group", T: group}, {Key: "log_stream", T: stream}}
	var ds []Data
	for i := range 10 {
		ds = append(ds, Data{Tag: fmt.Sprintf("kube.c%d", i%2), Body: fmt.Appendf(nil, `{"ns":"shop","pod":"p%d"}`, i)})
	}
	want := `log_stream "${tag[1]}-${record.pod|none}": ${record.pod|none} took 10 values in 10 records, e.g. "p0", "p1"`
	if got := Spread(ts, ds, "unknown"); got != want {
		t.Errorf("Spread:\n%s\nwant\n%s", got, want)
	}
	if got := Spread(ts, nil, "unknown"); !strings.HasPrefix(got, "no record to look at") {
		t.Errorf("Spread of no records: %s", got)
	}
	static, _ := Parse("/x/%S", Options{})
	if got := Spread([]Named{{Key: "log_group", T: static}}, ds, "unknown"); !strings.Contains(got, "no template has a tag or field placeholder") {
		t.Errorf("Spread without placeholders: %s", got)
	}
}
