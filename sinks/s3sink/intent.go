package s3sink

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/logfwd/forwarder/sinks"
)

// intentPrefix starts the sink-state key of every intent:
// intent/<object key>.
const intentPrefix = "intent/"

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

	// WasBytes and WasSHA256 are the object the intent described before
	// Recover rebuilt it into other compressed bytes (the compressor
	// changed between the crash and the restart): found under the key, it
	// holds these records too. Stored with the rebuilt object's sum, so
	// that a Recover tried again (the upload failed) still knows it.
	WasBytes  int64  `json:"was_bytes,omitempty"`
	WasSHA256 string `json:"was_sha256,omitempty"`
}

// was is the object the intent described before a rebuild, or nil.
func (in *intent) was() *objectSum {
	if in.WasSHA256 == "" {
		return nil
	}
	return &objectSum{bytes: in.WasBytes, sha256: in.WasSHA256}
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
