package inputs

import (
	"compress/gzip"
	"io"
	"math/bits"
	"sync"

	"github.com/logfwd/forwarder/wal"
)

// Buffers of the inputs come in size classes, powers of two from 4 KiB to
// 1 MiB, each with a pool of its own, so that what a connection reserves
// from the Budget (a buffer's capacity) is at most twice what it needs,
// and a buffer handed back is found again by the next connection that
// needs that much. Other sizes, larger ones among them, are allocated as
// asked and left to the garbage collector: a few big messages do not pin
// their memory.
const (
	minClassShift = 12 // 4 KiB
	maxClassShift = 20 // 1 MiB
)

var bytePools [maxClassShift - minClassShift + 1]sync.Pool // *[]byte

// BufClass is n rounded up to its class, or n itself above the largest
// class.
func BufClass(n int) int {
	if n <= 1<<minClassShift {
		return 1 << minClassShift
	}
	if n > 1<<maxClassShift {
		return n
	}
	return 1 << bits.Len(uint(n-1))
}

func classIndex(c, minShift, maxShift int) (int, bool) {
	if c < 1<<minShift || c > 1<<maxShift || c&(c-1) != 0 {
		return 0, false
	}
	return bits.TrailingZeros(uint(c)) - minShift, true
}

// GetBuf returns an empty buffer of capacity n, from its pool when n is a
// class (BufClass). Reserve n from the Budget before calling it.
func GetBuf(n int) []byte {
	if i, ok := classIndex(n, minClassShift, maxClassShift); ok {
		if p, ok := bytePools[i].Get().(*[]byte); ok {
			return (*p)[:0]
		}
	}
	return make([]byte, 0, n)
}

// PutBuf hands b back for reuse; b must not be used after. Buffers not of a
// class are dropped.
func PutBuf(b []byte) {
	if i, ok := classIndex(cap(b), minClassShift, maxClassShift); ok {
		b = b[:0]
		bytePools[i].Put(&b)
	}
}

// Record slices have classes too, of 64 to 131,072 records (3.5 KiB to
// 7 MiB).
const (
	minRecordsShift = 6
	maxRecordsShift = 17
	// RecordSize is what one wal.Record takes in a slice, for the Budget.
	RecordSize = 56
)

var recordPools [maxRecordsShift - minRecordsShift + 1]sync.Pool // *[]wal.Record

// RecordsClass is n rounded up to its class, or n itself above the largest.
func RecordsClass(n int) int {
	if n <= 1<<minRecordsShift {
		return 1 << minRecordsShift
	}
	if n > 1<<maxRecordsShift {
		return n
	}
	return 1 << bits.Len(uint(n-1))
}

// GetRecords returns an empty slice of capacity n, from its pool when n is
// a class (RecordsClass). Reserve n times RecordSize from the Budget before
// calling it.
func GetRecords(n int) []wal.Record {
	if i, ok := classIndex(n, minRecordsShift, maxRecordsShift); ok {
		if p, ok := recordPools[i].Get().(*[]wal.Record); ok {
			return (*p)[:0]
		}
	}
	return make([]wal.Record, 0, n)
}

// PutRecords hands r back for reuse, cleared so that it keeps no body alive.
func PutRecords(r []wal.Record) {
	if i, ok := classIndex(cap(r), minRecordsShift, maxRecordsShift); ok {
		r = r[:cap(r)]
		clear(r)
		r = r[:0]
		recordPools[i].Put(&r)
	}
}

// gzipReaders keeps decompressors (each holds a 32 KiB window and its
// tables) for the next compressed message or body, of any connection: a
// connection keeps none.
var gzipReaders sync.Pool // *gzip.Reader

// GetGzip returns a decompressor reading r (one or more gzip members),
// or the error of its first member's header. Give it back with PutGzip.
func GetGzip(r io.Reader) (*gzip.Reader, error) {
	if zr, ok := gzipReaders.Get().(*gzip.Reader); ok {
		if err := zr.Reset(r); err != nil {
			gzipReaders.Put(zr)
			return nil, err
		}
		return zr, nil
	}
	return gzip.NewReader(r)
}

// PutGzip hands a decompressor of GetGzip back; nil is ignored.
func PutGzip(zr *gzip.Reader) {
	if zr != nil {
		gzipReaders.Put(zr)
	}
}
