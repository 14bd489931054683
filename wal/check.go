package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

// bbolt's meta page layout (version 2), read here with plain file reads so
// that a damaged or truncated file is reported before bbolt maps it: bbolt
// reads pages through mmap, and a page past the end of a truncated file
// faults the process instead of returning an error.
const (
	boltMagic       = 0xED0CDAED
	boltVersion     = 2
	boltPageHeader  = 16
	boltMetaSumSize = 56 // bytes covered by the meta checksum
)

type boltMeta struct {
	pageSize uint32
	freelist uint64 // the freelist's page; boltNoFreelist: none synced
	pgid     uint64 // high-water mark: pages in use
	txid     uint64
}

const (
	boltNoFreelist   = ^uint64(0)
	boltFreelistPage = 0x10 // the page flag of a freelist page
)

func readMeta(b []byte) (boltMeta, error) {
	if len(b) < boltPageHeader+boltMetaSumSize+8 {
		return boltMeta{}, errors.New("short meta page")
	}
	m := b[boltPageHeader:]
	le := binary.LittleEndian
	if le.Uint32(m[0:4]) != boltMagic {
		return boltMeta{}, errors.New("bad magic")
	}
	if v := le.Uint32(m[4:8]); v != boltVersion {
		return boltMeta{}, fmt.Errorf("bbolt version %d", v)
	}
	h := fnv.New64a()
	h.Write(m[:boltMetaSumSize])
	if h.Sum64() != le.Uint64(m[56:64]) {
		return boltMeta{}, errors.New("meta checksum mismatch")
	}
	return boltMeta{pageSize: le.Uint32(m[8:12]), freelist: le.Uint64(m[32:40]), pgid: le.Uint64(m[40:48]), txid: le.Uint64(m[48:56])}, nil
}

// checkFile verifies, without mapping the file, that at least one meta page
// is intact and that the file holds every page that meta page refers to.
// One damaged meta page is not fatal: bbolt then uses the other one, which is
// what a power loss in the middle of a meta write leaves behind. It is
// returned as damaged so that Open can warn and Verify can report it.
func checkFile(path string) (damaged error, err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	corrupt := func(off int64, format string, args ...any) error {
		return &CorruptionError{Path: path, Offset: off, Err: fmt.Errorf(format, args...)}
	}
	if size == 0 {
		return nil, corrupt(0, "file is empty (truncated?); move it away to start with an empty WAL")
	}
	buf := make([]byte, 4096)
	n, err := f.ReadAt(buf, 0)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("read meta page: %w", err)
	}
	m0, err0 := readMeta(buf[:n])
	pageSize := int64(os.Getpagesize())
	if err0 == nil {
		pageSize = int64(m0.pageSize)
	}
	buf1 := make([]byte, 4096)
	n1, err := f.ReadAt(buf1, pageSize)
	if err != nil && err != io.EOF {
		return nil, fmt.Errorf("read second meta page: %w", err)
	}
	m1, err1 := readMeta(buf1[:n1])
	var m boltMeta
	switch {
	case err0 != nil && err1 != nil:
		return nil, corrupt(0, "both meta pages are damaged (page 0: %v; page 1: %v)", err0, err1)
	case err0 != nil:
		m = m1
		damaged = corrupt(0, "meta page 0 is damaged (%v); using meta page 1, transaction %d", err0, m1.txid)
	case err1 != nil:
		m = m0
		damaged = corrupt(pageSize, "meta page 1 is damaged (%v); using meta page 0, transaction %d", err1, m0.txid)
	case m1.txid > m0.txid:
		m = m1
	default:
		m = m0
	}
	if need := int64(m.pgid) * int64(m.pageSize); size < need {
		return damaged, corrupt(size, "file is %d bytes but its meta page refers to %d pages of %d bytes (%d bytes): truncated", size, m.pgid, m.pageSize, need)
	}
	return damaged, checkFreelist(f, path, m)
}

// errDamagedFreelist: the freelist page does not hold a freelist. Only a
// read-write open loads it (bbolt's check too): a read-only one reads the
// records.
var errDamagedFreelist = errors.New("the freelist page is damaged")

// checkFreelist checks the freelist page meta m names: a freelist page,
// its ids within the file. bbolt loads it at a read-write open (and in its
// consistency check) without checking it: a damaged one would panic there,
// or hand out pages in use to the next commit.
func checkFreelist(f *os.File, path string, m boltMeta) error {
	if m.freelist == boltNoFreelist {
		return nil
	}
	off := int64(m.freelist) * int64(m.pageSize)
	corrupt := func(format string, args ...any) error {
		return &CorruptionError{Path: path, Offset: off, Err: fmt.Errorf("%w (page %d): "+format+"; forwarder wal dump saves the records, and the service starts again on a new wal.db once this one is moved away", append([]any{errDamagedFreelist, m.freelist}, args...)...)}
	}
	if m.freelist < 2 || m.freelist >= m.pgid {
		return corrupt("its id is outside the file's %d pages", m.pgid)
	}
	h := make([]byte, boltPageHeader+8)
	if _, err := f.ReadAt(h, off); err != nil {
		return fmt.Errorf("read the freelist page: %w", err)
	}
	le := binary.LittleEndian
	id, flags, count, overflow := le.Uint64(h[0:8]), le.Uint16(h[8:10]), uint64(le.Uint16(h[10:12])), uint64(le.Uint32(h[12:16]))
	if id != m.freelist || flags != boltFreelistPage {
		return corrupt("it holds page %d with flags %#x", id, flags)
	}
	if m.freelist+overflow >= m.pgid { // its pages lie below the high-water mark, which the file holds (checkFile)
		return corrupt("its %d overflow pages reach past the file's %d pages", overflow, m.pgid)
	}
	start := int64(boltPageHeader)
	if count == 0xFFFF { // the count is the first id's place
		count, start = le.Uint64(h[16:24]), boltPageHeader+8
	}
	if room := (overflow+1)*uint64(m.pageSize) - uint64(start); count > room/8 {
		return corrupt("%d ids do not fit its %d pages", count, overflow+1)
	}
	// Read a piece at a time: a freelist of a large file is megabytes.
	buf := make([]byte, 64<<10)
	for at := uint64(0); at < count; {
		n := min(count-at, uint64(len(buf)/8))
		if _, err := f.ReadAt(buf[:n*8], off+start+int64(at*8)); err != nil {
			return corrupt("its ids cannot be read: %v", err)
		}
		for i := range n {
			if p := le.Uint64(buf[8*i:]); p < 2 || p >= m.pgid {
				return corrupt("it lists page %d, outside the file's %d pages", p, m.pgid)
			}
		}
		at += n
	}
	return nil
}
