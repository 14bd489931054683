package template

import "testing"

// A field that is an object renders the fallback, noted Missing; the
// warning's "missing" (Template.Missing) should name it.
func TestMissingNamesAnObjectField(t *testing.T) {
	tp, err := Parse("g/${record.kubernetes}", Options{})
	if err != nil {
		t.Fatal(err)
	}
	d := &Data{Tag: "a", Body: []byte(`{"kubernetes":{"pod":"p"}}`)}
	got, notes := tp.Render(d, "unknown")
	t.Logf("rendered %q notes %v", got, notes)
	if notes&Missing != 0 && len(tp.Missing(d)) == 0 {
		t.Errorf("rendered the fallback (Missing) but Missing() names nothing")
	}
}
