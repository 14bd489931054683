package s3sink

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/logfwd/forwarder/sinks"
)

// intentPrefix starts the sink-state key of every intent:
// intent/<object key>.
const intentPrefix = IntentPrefix

// IntentPrefix starts the keys of the sink's state under which it keeps
// its interrupted work (see intentPrefix).
const IntentPrefix = "intent/"

const intentVersion = 1

// intent is committed to the sink's state before an object is uploaded and
// deleted in the transaction that records its batch as delivered. It holds
// all that shapes the object, so that Recover rebuilds the same bytes
// under the same key from the WAL whatever the configuration is by then.
type intent struct {
	Version   int    `json:"v"`
	Key       string `json:"key"`
	Partition string `json:"partition"`
	First     uint64 `json:"first"` // sequence numbers of the batch's first and last records
	Last      uint64 `json:"last"`
	Records   int    `json:"records"`
	Bytes     int64  `json:"bytes"`  // the object's length, as stored
	SHA256    string `json:"sha256"` // hex, of the object as stored; sent as its checksum
	// The JSON lines before compression: their length and CRC-32C tell a
	// WAL that disagrees with the intent from a compressor whose output
	// changed (an upgrade between the crash and the restart).
	LinesBytes  int64  `json:"lines_bytes"`
	LinesCRC32C uint32 `json:"lines_crc32c"`
	// Members are the records of each compressed member when the object
	// was built member by member (an object of one member leaves it out).
	Members     []int    `json:"members,omitempty"`
	UUID        string   `json:"uuid,omitempty"`      // what ${uuid} rendered
	UploadID    string   `json:"upload_id,omitempty"` // the multipart upload in progress
	KeyTemplate string   `json:"key_template"`
	Hostname    string   `json:"hostname"`
	Encoding    encoding `json:"encoding"`
	// KeyRules are the rules the key was rendered with: keyRulesSanitised,
	// or keyRulesVerbatim (0, absent) in intents written before values
	// were sanitised.
	KeyRules int `json:"key_rules,omitempty"`
	// Match are the sink's match globs when the intent was written
	// (Options.Match; absent in intents written before they were kept).
	Match []string `json:"match,omitempty"`
	// Bucket is the bucket the object goes to (absent in intents written
	// before it was kept: the sink's). An upload is finished in the bucket
	// it began in; see Sink.rebucket for a bucket changed since.
	Bucket string `json:"bucket,omitempty"`

	// Was are the objects the intent described before Recover rebuilt it
	// into other compressed bytes (the compressor changed between a crash
	// and the restart, maybe more than once): found under the key, one of
	// them holds these records too. Stored with the rebuilt object's sum,
	// so that a Recover tried again (the upload failed, or the process
	// stopped once more) still knows them. At most maxWas, the first kept.
	Was []wasObject `json:"was,omitempty"`

	// createLost: a CreateMultipartUpload of this process had no answer
	// (or a 5xx) and may have made an upload whose id is not known; the
	// next attempt aborts the key's uploads first. After a crash Recover
	// does (abortOrphans). Not stored.
	createLost bool
}

// wasObject is an object an intent described before a rebuild.
type wasObject struct {
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

const maxWas = 4

// rebuilt notes that in's object, as it described it, is replaced by o.
func (in *intent) rebuilt(o *object) {
	old := wasObject{Bytes: in.Bytes, SHA256: in.SHA256}
	if !slices.Contains(in.Was, old) {
		if len(in.Was) == maxWas {
			in.Was = slices.Delete(in.Was, 1, 2) // the first uploaded, and the latest ones
		}
		in.Was = append(in.Was, old)
	}
	in.setObject(o)
}

// objectSum is what tells one object from another: its length and SHA-256.
type objectSum struct {
	bytes  int64
	sha256 string // hex
}

func intentKey(objectKey string) []byte { return []byte(intentPrefix + objectKey) }

func (in *intent) setObject(o *object) {
	in.Bytes, in.SHA256 = o.size, o.sha256
	in.LinesBytes, in.LinesCRC32C = o.lines, o.linesCRC32
}

// putIntent commits in durably.
func putIntent(ctx context.Context, st sinks.State, key []byte, in *intent) error {
	v, err := json.Marshal(in)
	if err != nil {
		return err
	}
	if err := st.Put(ctx, key, v); err != nil {
		return fmt.Errorf("commit intent %q: %w", key, err)
	}
	return nil
}
