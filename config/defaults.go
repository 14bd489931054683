package config

import "time"

// Default returns the configuration of an empty file: every key at its default, both inputs
// enabled and no sinks.
func Default() *Config {
	return &Config{
		DataDir:         "/var/lib/forwarder",
		Log:             Log{Level: LevelInfo, Format: FormatText},
		ShutdownTimeout: Duration(30 * time.Second),
		MemoryLimit:     128 * MiB,
		WAL: WAL{
			MaxBytes:     10 * GiB,
			WhenFull:     WhenFullBlock,
			Sync:         SyncAlways,
			DedupWindow:  Duration(10 * time.Minute),
			MinFreeBytes: 64 * MiB,
		},
		Inputs: Inputs{Forward: defaultForward(), HTTP: defaultHTTP()},
		Admin:  Admin{Listen: "127.0.0.1:9880"},
	}
}

func defaultForward() *Forward {
	return &Forward{
		Listen:               "127.0.0.1:24224",
		MaxMessageBytes:      16 * MiB,
		MaxConnections:       1024,
		HandshakeTimeout:     Duration(10 * time.Second),
		MaxRecordsPerMessage: 100_000,
	}
}

func defaultHTTP() *HTTP {
	return &HTTP{
		Listen:               "127.0.0.1:8080",
		MaxBodyBytes:         16 * MiB,
		TimeField:            "time",
		MaxConnections:       1024,
		ReadHeaderTimeout:    Duration(10 * time.Second),
		MaxRecordsPerRequest: 100_000,
	}
}

// InputMemory is the inputs' memory budget in bytes: three eighths of memory_limit (48 MiB of
// the default 128 MiB), shared by both inputs. It bounds what they hold of messages and request
// bodies as read, decompressed and decoded into records, until the WAL has stored them; one
// message or request may take all of it, and a sixteenth more is kept for small ones (see
// inputs.Budget). Three eighths, not less, because one message at the default
// max_message_bytes (16 MiB) with max_records_per_message records needs about 38 MiB while it is
// decoded: its bytes, its records' JSON and the records. With the sinks' three eighths, about a
// quarter of the limit is left for the WAL, the requests the sinks build and send, and the
// garbage collector's room.
func (c *Config) InputMemory() int64 { return int64(c.MemoryLimit) * 3 / 8 }

// defaultMatch is a sink's match when the key is absent: every tag.
func defaultMatch() []string { return []string{"**"} }

// DefaultS3 is an S3 sink's settings before the file's: the defaults README lists. The
// S3 sink fills the settings a hand-built S3 leaves zero from it too.
func DefaultS3() *S3 { return defaultS3() }

func defaultS3() *S3 {
	return &S3{
		Key:                "logs/${tag}/%Y/%m/%d/%H/${hostname}-${seq}.json.gz",
		Compression:        CompressionGzip,
		CompressionLevel:   1,
		MaxObjectBytes:     64 * MiB,
		MaxObjectAge:       Duration(5 * time.Minute),
		MaxOpenObjects:     10_000,
		MaxPartitions:      DefaultMaxPartitions,
		MultipartThreshold: 16 * MiB,
		TimeKey:            "@timestamp",
		StagingMaxBytes:    stagingAuto,
	}
}

// DefaultMaxPartitions is a sink's max_partitions when the file leaves it out: room for
// a stream or key prefix per container of a large cluster's aggregator, far below what
// makes the drain slow.
const DefaultMaxPartitions = 20_000

// stagingAuto is staging_max_bytes when the file leaves it out: Parse makes it
// StagingDefault of the WAL's max_bytes.
const stagingAuto Size = -1

// StagingDefault is an S3 sink's staging_max_bytes when the file leaves it out: an eighth
// of wal.max_bytes (1.25 GiB of the default 10 GiB). Staged members are compressed copies of
// records the WAL holds until their objects are uploaded, so they take a fraction of what
// the WAL may: the disk under data_dir needs room for wal.max_bytes, wal.min_free_bytes and
// each S3 sink's staging_max_bytes.
func StagingDefault(walMaxBytes Size) Size { return walMaxBytes / 8 }

// finish fills the defaults that depend on other keys.
func (c *Config) finish() {
	for _, s := range c.Sinks {
		if s.S3 != nil && s.S3.StagingMaxBytes == stagingAuto {
			s.S3.StagingMaxBytes = StagingDefault(c.WAL.MaxBytes)
		}
	}
}

// CompressionExtension is what an S3 object's key ends with after ".json" for a
// compression: ".gz", ".zst", or nothing.
func CompressionExtension(compression string) string {
	switch compression {
	case CompressionGzip:
		return ".gz"
	case CompressionZstd:
		return ".zst"
	}
	return ""
}

func defaultCloudWatch() *CloudWatch {
	return &CloudWatch{
		Fallback:             "unknown",
		CreateGroup:          true,
		CreateStream:         true,
		RetentionDays:        30,
		LogGroupClass:        LogGroupClassStandard,
		FlushInterval:        Duration(5 * time.Second),
		MaxConcurrentStreams: 64,
		MaxPartitions:        DefaultMaxPartitions,
		Settle:               Duration(10 * time.Second),
		ReadRate:             10,
		CreateRate:           10,
		GroupCreateRate:      1,
	}
}

// setDefaults lets the decoder fill an input it allocates because the file names it.
func (f *Forward) setDefaults() { *f = *defaultForward() }
func (h *HTTP) setDefaults()    { *h = *defaultHTTP() }

// SinkBuffers is how much memory each sink's records may hold, by sink name: three eighths
// of memory_limit in all, an S3 sink weighing twice a CloudWatch one (an S3 object is built
// from records held in memory, a CloudWatch request from at most 1 MiB of them), a
// CloudWatch sink at most an eighth of the limit (the requests it builds copy its records
// twice over: the SDK's events and their JSON), and no sink below 4 MiB. The rest of the
// limit is for the inputs, the WAL, requests being built and sent, and the garbage
// collector's room.
func (c *Config) SinkBuffers() map[string]int {
	weight := func(s Sink) int64 {
		if s.Type == SinkS3 {
			return 2
		}
		return 1
	}
	var total int64
	for _, s := range c.Sinks {
		total += weight(s)
	}
	out := make(map[string]int, len(c.Sinks))
	for _, s := range c.Sinks {
		share := int64(c.MemoryLimit) * 3 / 8 * weight(s) / total
		if s.Type == SinkCloudWatch {
			share = min(share, int64(c.MemoryLimit)/8)
		}
		out[s.Name] = int(max(share, int64(4*MiB)))
	}
	return out
}
