package config

import "time"

// Default returns the configuration of an empty file: every key at its default, both inputs
// enabled and no sinks.
func Default() *Config {
	return &Config{
		DataDir:         "/var/lib/forwarder",
		Log:             Log{Level: LevelInfo, Format: FormatText},
		ShutdownTimeout: Duration(30 * time.Second),
		WAL: WAL{
			MaxBytes:    10 * GiB,
			WhenFull:    WhenFullBlock,
			Sync:        SyncAlways,
			DedupWindow: Duration(10 * time.Minute),
		},
		Inputs: Inputs{Forward: defaultForward(), HTTP: defaultHTTP()},
		Admin:  Admin{Listen: "127.0.0.1:9880"},
	}
}

func defaultForward() *Forward {
	return &Forward{
		Listen:          "127.0.0.1:24224",
		MaxMessageBytes: 16 * MiB,
		MaxConnections:  1024,
	}
}

func defaultHTTP() *HTTP {
	return &HTTP{
		Listen:       "127.0.0.1:8080",
		MaxBodyBytes: 16 * MiB,
		TimeField:    "time",
	}
}

// defaultMatch is a sink's match when the key is absent: every tag.
func defaultMatch() []string { return []string{"**"} }

func defaultS3() *S3 {
	return &S3{
		Key:                "logs/${tag}/%Y/%m/%d/%H/${hostname}-${seq}.json.gz",
		Compression:        CompressionGzip,
		CompressionLevel:   1,
		MaxObjectBytes:     64 * MiB,
		MaxObjectAge:       Duration(5 * time.Minute),
		MaxOpenObjects:     256,
		MultipartThreshold: 16 * MiB,
		TimeKey:            "@timestamp",
	}
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
	}
}

// setDefaults lets the decoder fill an input it allocates because the file names it.
func (f *Forward) setDefaults() { *f = *defaultForward() }
func (h *HTTP) setDefaults()    { *h = *defaultHTTP() }
