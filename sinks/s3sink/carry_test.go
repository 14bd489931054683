package s3sink

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/sinks"
)

// An object built batch by batch: each batch is compressed as a member and
// carried (no upload, no intent) until a final batch or a full object; the
// object is then the members one after the other, which gzip and zstd read
// as one stream, and its intent names the members, so that a restart
// rebuilds the same bytes.
//
// Staged, the members are written to a file, the carry holds none of their
// bytes, and the object uploaded from the file has the same bytes as the
// one built in memory.
func TestObjectOfMembers(t *testing.T) {
	srv, url := startEmu(t)
	built := map[string][]byte{} // by compression: the object built in memory
	for _, c := range []struct {
		compression string
		level       int
		flush       bool // the final batch is the carry alone
	}{
		{config.CompressionGzip, 1, false},
		{config.CompressionZstd, 1, true},
		{config.CompressionNone, 0, false},
	} {
		for _, staged := range []bool{false, true} {
			mode := map[bool]string{false: "in memory", true: "staged"}[staged]
			t.Run(c.compression+" "+mode, func(t *testing.T) {
				cfg := testConfig(url)
				cfg.Key = "members/" + c.compression + "/" + strings.ReplaceAll(mode, " ", "-") + "/${tag}/${seq}"
				cfg.Compression, cfg.CompressionLevel = c.compression, c.level
				cfg.MaxObjectBytes = config.MiB
				s := newTestSink(t, cfg)
				var stagingDir string
				if staged {
					s, stagingDir = newStagedSink(t, cfg)
				}
				recs := batchRecs("a", 400)
				st := newMemState(recs)
				p := s.Partition(&recs[0])
				puts := srv.Calls()["PutObject"]
				var carry sinks.Carry
				room := s.maxBytes
				for i := 0; i < 400; i += 100 {
					final := i == 300 && !c.flush
					size := 0
					for j := range recs[i : i+100] {
						size += s.Size(&recs[i+j])
					}
					if size > room {
						t.Fatalf("batch of %d bytes, room %d", size, room)
					}
					out, err := s.Send(context.Background(), &sinks.Batch{Partition: p, Records: recs[i : i+100], State: st, Carry: carry, Final: final})
					if err != nil {
						t.Fatal(err)
					}
					if final {
						if out.Carry != nil || len(out.DeleteState) != 1 {
							t.Fatalf("final batch: outcome %+v", out)
						}
						break
					}
					if out.Carry == nil || len(out.DeleteState) != 0 || len(st.intents()) != 0 || srv.Calls()["PutObject"] != puts {
						t.Fatalf("batch %d: outcome %+v, intents %v, %d uploads: want it carried", i/100, out, st.intents(), srv.Calls()["PutObject"]-puts)
					}
					if out.Carry.Mem() <= 0 || out.Carry.Room() != room-size {
						t.Fatalf("carry: mem %d, room %d, want room %d", out.Carry.Mem(), out.Carry.Room(), room-size)
					}
					if o := out.Carry.(*openObject); staged {
						fi, err := os.Stat(o.path)
						if err != nil || filepath.Dir(o.path) != stagingDir || fi.Size() != o.size {
							t.Fatalf("staged carry of %d bytes: file %v, %v", o.size, fi, err)
						}
						if max := objectOverhead + stagedMemberOverhead*len(o.counts); out.Carry.Mem() > max || o.bodies != nil {
							t.Fatalf("staged carry: mem %d, want at most %d, none of the members' bytes", out.Carry.Mem(), max)
						}
					} else if out.Carry.Mem() < int(o.size) {
						t.Fatalf("carry in memory: mem %d for %d bytes of members", out.Carry.Mem(), o.size)
					}
					carry, room = out.Carry, out.Carry.Room()
				}
				if c.flush {
					if _, err := s.Send(context.Background(), &sinks.Batch{Partition: p, State: st, Carry: carry, Final: true}); err != nil {
						t.Fatal(err)
					}
				}
				if n := srv.Calls()["PutObject"] - puts; n != 1 {
					t.Fatalf("%d uploads, want 1", n)
				}
				if n := stagedFiles(t, stagingDir); staged && n != 0 {
					t.Errorf("%d files staged once the object is uploaded", n)
				}
				keys := st.intents()
				if len(keys) != 1 {
					t.Fatalf("intents %v", keys)
				}
				raw, _ := st.Get([]byte(keys[0]))
				var in intent
				if err := json.Unmarshal(raw, &in); err != nil {
					t.Fatal(err)
				}
				if want := []int{100, 100, 100, 100}; c.flush {
					if !equalInts(in.Members, want) {
						t.Errorf("intent members %v, want %v", in.Members, want)
					}
				} else if !equalInts(in.Members, want) || in.Records != 400 || in.First != recs[0].Seq || in.Last != recs[399].Seq {
					t.Errorf("intent %s", raw)
				}
				key := strings.TrimPrefix(keys[0], intentPrefix)
				objs := readObjects(t, newReader(t, url), key)
				if len(objs) != 1 || len(objs[0].Lines) != 400 {
					t.Fatalf("%d objects under %s", len(objs), key)
				}
				whole, err := s.enc.build(recs)
				if err != nil {
					t.Fatal(err)
				}
				if got, want := strings.Join(objs[0].Lines, "\n")+"\n", string(decompress(t, objs[0].ContentEncoding, whole.body)); got != want {
					t.Fatal("the object's lines are not those of its records")
				}
				if c.compression == config.CompressionGzip {
					// An independent reader: gzip(1) reads the members as one stream.
					cmd := exec.Command("gzip", "-dc")
					cmd.Stdin = bytes.NewReader(objs[0].Body)
					out, err := cmd.Output()
					if err != nil {
						t.Fatalf("gzip -dc: %v", err)
					}
					if bytes.Count(out, []byte("\n")) != 400 || !bytes.HasPrefix(out, []byte(objs[0].Lines[0])) {
						t.Fatalf("gzip -dc gave %d lines", bytes.Count(out, []byte("\n")))
					}
					if bytes.Equal(objs[0].Body, whole.body) {
						t.Fatal("the object is one gzip member: nothing was built member by member")
					}
				}
				// The same bytes in memory and staged.
				body := objs[0].Body
				if !staged {
					built[c.compression] = body
				} else if !bytes.Equal(body, built[c.compression]) {
					t.Fatal("the object uploaded from its staged file differs from the one built in memory")
				}
				// A crash after the upload: the restart rebuilds the same bytes.
				deleteObject(t, url, key)
				if err := newTestSink(t, cfg).Recover(context.Background(), st); err != nil {
					t.Fatal(err)
				}
				again := readObjects(t, newReader(t, url), key)
				if len(again) != 1 || !bytes.Equal(again[0].Body, body) {
					t.Fatal("the rebuilt object differs from the one first uploaded")
				}
				if st.delivered[p] != recs[399].Seq || len(st.intents()) != 0 {
					t.Errorf("delivered %v, intents left %v", st.delivered, st.intents())
				}
			})
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A rebuild whose members do not add up to the intent's records is refused,
// not uploaded.
func TestBuildSplitChecksTheMembers(t *testing.T) {
	e, err := newEncoder(encoding{Compression: config.CompressionGzip, Level: 1})
	if err != nil {
		t.Fatal(err)
	}
	recs := batchRecs("a", 10)
	for _, counts := range [][]int{{5, 6}, {5, 4}, {0, 10}} {
		if _, err := e.buildSplit(recs, counts); err == nil {
			t.Errorf("members %v of 10 records: no error", counts)
		}
	}
	one, _ := e.build(recs)
	two, err := e.buildSplit(recs, []int{4, 6})
	if err != nil {
		t.Fatal(err)
	}
	if one.lines != two.lines || one.linesCRC32 != two.linesCRC32 || one.sha256 == two.sha256 {
		t.Errorf("one member: %d bytes of lines, crc %08x; two: %d, %08x; sha256 equal: %v", one.lines, one.linesCRC32, two.lines, two.linesCRC32, one.sha256 == two.sha256)
	}
}

// The sink ends an object by itself, without a final batch, once it holds
// max_object_bytes of lines; an object carried as a single member and then
// delivered alone is an object of one member (its intent names none), and
// a restart rebuilds either.
func TestObjectEndsWhenFull(t *testing.T) {
	_, url := startEmu(t)
	cfg := testConfig(url)
	cfg.Key = "full/${tag}/${seq}"
	cfg.MaxObjectBytes = 8 * config.KiB
	s := newTestSink(t, cfg)
	recs := batchRecs("a", 400)
	st := newMemState(recs)
	p := s.Partition(&recs[0])
	lim := s.Limits()
	if lim.MaxBytes != 1024 || lim.MaxFinalBytes != 8192 {
		t.Fatalf("limits %+v", lim)
	}
	// Batches as the drainer cuts them: within the carry's room and
	// MaxBytes, until the room is too small for the next record.
	var carry sinks.Carry
	ended, i := 0, 0
	for i < len(recs) && ended < 2 {
		room := lim.MaxBytes
		if carry != nil {
			room = min(room, carry.Room())
		}
		j, size := i, 0
		for j < len(recs) && size+s.Size(&recs[j]) <= room {
			size += s.Size(&recs[j])
			j++
		}
		b := &sinks.Batch{Partition: p, Records: recs[i:j], State: st, Carry: carry}
		if j == i {
			b.Records, b.Final = nil, true // no room: the carry alone
		}
		out, err := s.Send(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		i, carry = j, out.Carry
		if carry == nil {
			ended++
			if len(out.DeleteState) != 1 {
				t.Fatalf("ended object: outcome %+v", out)
			}
		}
	}
	if ended != 2 {
		t.Fatalf("%d objects ended", ended)
	}
	objs := readObjects(t, newReader(t, url), "full/")
	for _, o := range objs {
		size := 0
		for _, l := range o.Lines {
			size += len(l) + 1
		}
		if size > 8192 || size < 8192-200 {
			t.Errorf("object %s holds %d bytes of lines, want a full 8 KiB", o.Key, size)
		}
	}

	// One member carried, then delivered alone.
	out, err := s.Send(context.Background(), &sinks.Batch{Partition: p, Records: recs[i : i+3], State: st})
	if err != nil || out.Carry == nil {
		t.Fatalf("outcome %+v, %v: want a carry", out, err)
	}
	before := len(st.intents())
	if _, err := s.Send(context.Background(), &sinks.Batch{Partition: p, State: st, Carry: out.Carry, Final: true}); err != nil {
		t.Fatal(err)
	}
	keys := st.intents()
	if len(keys) != before+1 {
		t.Fatalf("intents %v", keys)
	}
	raw, _ := st.Get([]byte(intentPrefix + objectKey(p, recs[i].Seq, "")))
	var in intent
	if err := json.Unmarshal(raw, &in); err != nil || in.Members != nil || in.Records != 3 {
		t.Fatalf("intent of one member: %s (%v)", raw, err)
	}
	// A restart rebuilds all three objects with the same bytes.
	want := readObjects(t, newReader(t, url), "full/")
	for _, o := range want {
		deleteObject(t, url, o.Key)
	}
	if err := newTestSink(t, cfg).Recover(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	got := readObjects(t, newReader(t, url), "full/")
	if len(got) != 3 || len(want) != 3 {
		t.Fatalf("%d objects rebuilt, %d first", len(got), len(want))
	}
	for k := range got {
		if got[k].Key != want[k].Key || !bytes.Equal(got[k].Body, want[k].Body) {
			t.Errorf("object %s rebuilt with other bytes", want[k].Key)
		}
	}
}
