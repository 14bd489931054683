package inputs

import (
	"reflect"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestInitMakesEverySeries: after Init, every metric labelled by input
// alone has the input's series, at 0 (the forward input's own metrics for
// it only); a metric added to Metrics is checked without naming it here.
func TestInitMakesEverySeries(t *testing.T) {
	forwardOnly := map[string]bool{"ChunkReused": true, "NilRecords": true, "NotMaps": true}
	for _, input := range []string{"forward", "http"} {
		m := NewMetrics(nil)
		m.Init(input)
		v := reflect.ValueOf(m).Elem()
		for i := range v.NumField() {
			name := v.Type().Field(i).Name
			c, ok := v.Field(i).Interface().(prometheus.Collector)
			if !ok {
				t.Fatalf("field %s is no collector", name)
			}
			var want int
			switch v.Field(i).Interface().(type) {
			case *prometheus.CounterVec, *prometheus.GaugeVec:
				if name == "Rejected" { // labelled by reason too: its series come with their reasons
					continue
				}
				if input == "forward" || !forwardOnly[name] {
					want = 1
				}
			case prometheus.Gauge: // MemoryLimit: one series, no label
				continue
			}
			if n := testutil.CollectAndCount(c); n != want {
				t.Errorf("%s after Init(%q): %d series, want %d", name, input, n, want)
			}
		}
	}
}
