package s3emu

import (
	"bytes"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"hash/crc32"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
)

// checksums are the x-amz-checksum-* headers the emulator verifies, as S3
// does, with the name S3 uses in its BadDigest message.
var checksums = []struct {
	header, name string
	new          func() hash.Hash
}{
	{"X-Amz-Checksum-Sha256", "SHA256", sha256.New},
	{"X-Amz-Checksum-Sha1", "SHA1", sha1.New},
	{"X-Amz-Checksum-Crc32", "CRC32", func() hash.Hash { return crc32.NewIEEE() }},
	{"X-Amz-Checksum-Crc32c", "CRC32C", func() hash.Hash { return crc32.New(crc32.MakeTable(crc32.Castagnoli)) }},
}

// maxVerifiedBody bounds the body held in memory to verify its checksum.
const maxVerifiedBody = 5 << 30

// verifyChecksum checks a PUT body (PutObject, UploadPart) against the
// x-amz-checksum-* header it carries, which gofakes3 stores but does not
// check. The body is read into memory and handed on. A mismatch answers
// 400 BadDigest and reports false. Bodies in aws-chunked encoding (trailing
// checksums, sent only over TLS) are passed through unchecked.
func verifyChecksum(w http.ResponseWriter, r *http.Request) bool {
	if strings.Contains(r.Header.Get("Content-Encoding"), "aws-chunked") ||
		strings.HasPrefix(r.Header.Get("X-Amz-Content-Sha256"), "STREAMING-") {
		return true
	}
	for _, c := range checksums {
		want := r.Header.Get(c.header)
		if want == "" {
			continue
		}
		n, err := strconv.ParseInt(r.Header.Get("Content-Length"), 10, 64)
		if err != nil || n < 0 || n > maxVerifiedBody {
			return true // gofakes3 answers for the length
		}
		body := make([]byte, n)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			writeError(w, r, http.StatusBadRequest, "IncompleteBody", "You did not provide the number of bytes specified by the Content-Length HTTP header.")
			return false
		}
		h := c.new()
		h.Write(body)
		if got := base64.StdEncoding.EncodeToString(h.Sum(nil)); got != want {
			writeError(w, r, http.StatusBadRequest, "BadDigest", "The "+c.name+" you specified did not match the calculated checksum.")
			return false
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		return true
	}
	return true
}

func floatBits(f float64) uint64 { return math.Float64bits(f) }
func bitsFloat(b uint64) float64 { return math.Float64frombits(b) }
