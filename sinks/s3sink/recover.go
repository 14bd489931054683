package s3sink

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/logfwd/forwarder/config"
	"github.com/logfwd/forwarder/sinks"
)

// Recover finishes the uploads a crash or a shutdown interrupted: for each
// intent it rebuilds the object from the WAL, checks it against the intent,
// uploads it again under the same key with the same bytes and records its
// batch as delivered. The drainer calls it once, before it reads records.
//
// S3 failing does not fail Recover: it retries with backoff (slowly, and
// saying once what to fix, for sink-permanent errors) until S3 answers or
// ctx ends. It returns an error only when it cannot go on: the WAL failed,
// an intent is damaged, or the WAL and an intent disagree.
func (s *Sink) Recover(ctx context.Context, st sinks.State) error {
	s.mu.Lock()
	taken := s.taken
	s.mu.Unlock()
	if taken != nil {
		// A key held another writer's object: the sink stays paused until
		// it restarts (as Send does), without uploading the object again
		// at every probe to meet the same refusal.
		return taken
	}
	if s.staging != nil {
		// No object is open yet: whatever is staged, a previous run left.
		s.staging.clean()
	}
	type found struct {
		key []byte
		in  intent
	}
	var all []found
	err := st.Scan([]byte(intentPrefix), func(k, v []byte) error {
		var in intent
		if err := json.Unmarshal(v, &in); err != nil {
			return fmt.Errorf("intent %q is damaged: %w", k, err)
		}
		if in.Version != intentVersion {
			return fmt.Errorf("intent %q has format version %d, this build reads %d", k, in.Version, intentVersion)
		}
		all = append(all, found{bytes.Clone(k), in})
		return nil
	})
	if err != nil {
		return fmt.Errorf("read intents: %w", err)
	}
	for i := range all {
		if err := s.recoverRetrying(ctx, st, all[i].key, &all[i].in); err != nil {
			return err
		}
	}
	return nil
}

// fatalError is a failure of Recover that retrying cannot mend.
type fatalError struct{ err error }

func (e *fatalError) Error() string { return e.err.Error() }
func (e *fatalError) Unwrap() error { return e.err }

func fatal(format string, args ...any) error { return &fatalError{fmt.Errorf(format, args...)} }

// recoverRetrying finishes one intent. A refusal for the object's content
// deletes the intent (the drainer sends the batch again and dead-letters
// it); other failures are returned classified, and the drainer retries
// Recover (pausing the sink for sink-permanent ones).
func (s *Sink) recoverRetrying(ctx context.Context, st sinks.State, ik []byte, in *intent) error {
	err := s.recoverOne(ctx, st, ik, in)
	if err == nil {
		return nil
	}
	var fe *fatalError
	if errors.As(err, &fe) {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("finish interrupted upload of %q: %w", in.Key, ctx.Err())
	}
	classified := s.classify(err)
	if sinks.Classify(classified).Class == sinks.RecordPermanent {
		// S3 will never take this object.
		if err := st.Delete(ctx, ik); err != nil {
			return fmt.Errorf("delete intent %q: %w", ik, err)
		}
		return nil
	}
	return classified
}

// recoverOne rebuilds, checks and uploads one intent's object and records
// its batch as delivered.
func (s *Sink) recoverOne(ctx context.Context, st sinks.State, ik []byte, in *intent) error {
	if s.bucketOf(in) != s.bucket {
		if done, err := s.rebucket(ctx, st, ik, in); err != nil || done {
			return err
		}
	}
	keys, enc := s.keys, s.enc
	if in.KeyTemplate != s.cfg.Key || in.Hostname != s.hostname || in.KeyRules != keyRulesSanitised {
		var err error
		if keys, err = newKeyRenderer(in.KeyTemplate, in.Hostname, in.KeyRules); err != nil {
			return fatal("intent %q: %w", ik, err)
		}
	}
	if in.Encoding != s.enc.enc {
		var err error
		if enc, err = newEncoder(in.Encoding); err != nil {
			return fatal("intent %q: %w", ik, err)
		}
	}
	read, match := st.ReadRange, func(string) bool { return true }
	if in.Match != nil && !slices.Equal(in.Match, s.match) {
		// The sink's match changed since: the batch's records are those
		// of the tags it took then.
		read, match = st.ReadRangeAll, config.NewTagMatcher(in.Match).Match
	}
	kept, err := read(in.First, in.Last, func(r *sinks.Record) bool {
		return match(r.Tag) && routed(st, keys, r) == in.Partition
	})
	if err != nil {
		return fatal("read records %d to %d for intent %q: %w", in.First, in.Last, ik, err)
	}
	if len(kept) < in.Records {
		// The WAL dropped records of the batch before it was delivered
		// (wal.when_full: drop_oldest, which counts them), or lost them
		// to a damaged entry (counted too). The object cannot be
		// rebuilt; whatever of it reached S3 stays. Should the upload
		// have landed before the crash, the batch is delivered, every
		// record with it: sent again, the records left would go under
		// the same key when the first survived, taken by this very
		// object (a false "another writer's object" pause).
		landed, err := s.landed(ctx, in)
		if err != nil {
			return err
		}
		if landed {
			if err := st.Delivered(ctx, in.Partition, in.Last, [][]byte{ik}); err != nil {
				return fatal("record delivery of %q: %w", in.Key, err)
			}
			s.m.recovered.Inc()
			s.log.Warn("an interrupted upload had landed, though the WAL no longer holds all of its records (wal.when_full: drop_oldest, or a damaged entry): delivered",
				"key", in.Key, "records", in.Records, "left", len(kept))
			return nil
		}
		s.log.Warn("not finishing an interrupted upload: the WAL dropped some of its records (wal.when_full: drop_oldest) or lost them to a damaged entry; the records left are sent again (their object's key is the first one's, which may be the same)",
			"key", in.Key, "records", in.Records, "left", len(kept))
		if in.UploadID != "" {
			_ = s.abort(ctx, s.bucketOf(in), in.Key, in.UploadID)
		}
		if err := st.Delete(ctx, ik); err != nil {
			return fatal("delete intent %q: %w", ik, err)
		}
		return nil
	}
	if len(kept) != in.Records {
		return fatal("the WAL and intent %q disagree: the intent has %d records from seq %d to %d, the WAL %d; not uploading %q",
			ik, in.Records, in.First, in.Last, len(kept), in.Key)
	}
	obj, err := enc.buildSplit(kept, in.Members)
	if err != nil {
		return fatal("rebuild object of intent %q: %w", ik, err)
	}
	if obj.lines != in.LinesBytes || obj.linesCRC32 != in.LinesCRC32C {
		return fatal("the WAL and intent %q disagree: the intent has %d records from seq %d to %d, %d bytes of lines with CRC-32C %08x; the WAL gives %d bytes with CRC-32C %08x; not uploading %q",
			ik, in.Records, in.First, in.Last, in.LinesBytes, in.LinesCRC32C, obj.lines, obj.linesCRC32, in.Key)
	}
	if obj.sha256 != in.SHA256 {
		// Same lines, other compressed bytes: the compressor changed.
		s.log.Warn("re-uploading an interrupted object with the same records but other compressed bytes (the compression library changed since it was first sent)",
			"key", in.Key, "sha256_was", in.SHA256, "sha256", obj.sha256)
		in.rebuilt(obj)
		if err := putIntent(ctx, st, ik, in); err != nil {
			return fatal("%w", err)
		}
	}
	s.abortOrphans(ctx, s.bucketOf(in), in.Key)
	already, err := s.upload(ctx, st, ik, in, bodyOf(obj, nil, 0))
	if err != nil {
		if keyTaken(err) && (in.KeyTemplate != s.cfg.Key || in.Hostname != s.hostname) {
			// Another writer's object is under the key, and this sink no
			// longer renders such keys (the fix for a collision): nothing
			// of the object is in S3, and its records, still in the WAL
			// after the cursor, go out again under the keys of today.
			s.log.Warn("not finishing an interrupted upload: another writer's object is under its key, which the key template or host name of today no longer renders; its records are sent again under the new keys",
				"key", in.Key, "records", in.Records, "key_template", in.KeyTemplate, "hostname", in.Hostname)
			if err := st.Delete(ctx, ik); err != nil {
				return fatal("delete intent %q: %w", ik, err)
			}
			return nil
		}
		if keyTaken(err) {
			s.mu.Lock()
			s.taken = err
			s.mu.Unlock()
		}
		return err
	}
	if err := st.Delivered(ctx, in.Partition, in.Last, [][]byte{ik}); err != nil {
		return fatal("record delivery of %q: %w", in.Key, err)
	}
	s.m.recovered.Inc()
	if !already {
		s.m.uncompressed.Add(float64(obj.lines))
	}
	args := []any{"key", in.Key, "records", in.Records, "members", max(len(in.Members), 1), "bytes", len(obj.body), "already_in_s3", already}
	if in.Bucket == "" && !already {
		// Begun by a build that did not record its bucket, and not found
		// in today's: finished there, which is right unless the bucket
		// changed since (then it may have landed in the earlier one).
		s.log.Warn("finished an interrupted upload begun by an earlier build, which did not record its bucket, in the sink's bucket: if the bucket changed since the crash, its records may be in the earlier bucket too", append(args, "bucket", s.bucket)...)
		return nil
	}
	s.log.Info("finished an interrupted upload", args...)
	return nil
}

// bucketOf is the bucket in's object goes to: the one it was begun in.
func (s *Sink) bucketOf(in *intent) string {
	if in.Bucket != "" {
		return in.Bucket
	}
	return s.bucket
}

// rebucket deals with an interrupted upload begun in another bucket than
// the sink's of today (sinks[].bucket changed between the crash and this
// start). When the object landed there, its batch is delivered where it
// is (done). Else it goes to today's bucket: the multipart upload it began
// there is aborted, and the intent, naming today's bucket, is stored
// before any upload. The old bucket gone or not allowed (NoSuchBucket,
// 403, or another region's), the sink cannot tell whether it landed: it
// says so, and the object goes to today's bucket too. Any other error
// (the network, credentials) is returned, to be tried again.
func (s *Sink) rebucket(ctx context.Context, st sinks.State, ik []byte, in *intent) (done bool, err error) {
	old := in.Bucket
	same, err := s.landed(ctx, in)
	switch {
	case err == nil && same:
		if err := st.Delivered(ctx, in.Partition, in.Last, [][]byte{ik}); err != nil {
			return false, fatal("record delivery of %q: %w", in.Key, err)
		}
		s.m.recovered.Inc()
		s.log.Info("an interrupted upload had landed in the bucket it was begun in, which the sink no longer names: left there",
			"bucket_then", old, "bucket", s.bucket, "key", in.Key, "records", in.Records)
		return true, nil
	case err == nil:
		if in.UploadID != "" {
			if err := s.abort(ctx, old, in.Key, in.UploadID); err != nil {
				s.log.Warn("could not abort a multipart upload left in the bucket the sink no longer names: the bucket's lifecycle rule (AbortIncompleteMultipartUpload) ends it",
					"bucket_then", old, "key", in.Key, "upload_id", in.UploadID, "error", err)
			}
		}
		s.abortOrphans(ctx, old, in.Key) // one begun before its id was kept
		s.log.Info("finishing an interrupted upload in the sink's bucket of today: it had not landed in the one it was begun in",
			"bucket_then", old, "bucket", s.bucket, "key", in.Key, "records", in.Records)
	default:
		// A refusal (4xx: gone, not allowed, another region) is the old
		// bucket's only if the credentials are good: the new bucket
		// answers them (the key there, or 404). Otherwise, or for a
		// passing fault, it is tried again, named after the old bucket.
		status := httpStatus(err)
		if sinks.Classify(err).Reason == "AccessDenied" { // landed's, for a 403
			status = http.StatusForbidden
		}
		refused := status >= 400 && status < 500 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests || status == http.StatusMovedPermanently
		_, herr := s.head(ctx, s.bucket, in.Key, "")
		switch {
		case refused && herr != nil && httpStatus(herr) == http.StatusForbidden:
			// Both refuse: the credentials, or the new bucket's
			// permissions, are at fault as much as the old bucket. Paused
			// until fixed; nothing is decided meanwhile.
			return false, sinks.NewSinkPermanent("AccessDenied", &actionError{
				msg: fmt.Sprintf("an upload interrupted before sinks[%s].bucket changed began in bucket %s, which refuses to be read (%v), and bucket %s refuses too (HTTP 403): "+
					"allow s3:GetObject and s3:ListBucket on arn:aws:s3:::%s and arn:aws:s3:::%s to the forwarder's credentials, or fix the credentials", s.name, old, err, s.bucket, old, s.bucket),
				code: "AccessDenied", err: herr,
			})
		case refused && herr != nil && httpStatus(herr) != http.StatusNotFound:
			if c := s.classify(herr); sinks.Classify(c).Class == sinks.SinkPermanent {
				return false, c // no credentials, expired ones: said as for any call
			}
			fallthrough
		case !refused:
			return false, sinks.NewRetryable("old_bucket", fmt.Errorf("an upload interrupted before sinks[%s].bucket changed began in bucket %s, which could not be read to tell whether it landed there: %w", s.name, old, err))
		}
		s.log.Warn("finishing an interrupted upload in the sink's bucket of today: the bucket it was begun in, which the sink no longer names, cannot be read to tell whether it landed there; if it did, its records are in both buckets",
			"bucket_then", old, "bucket", s.bucket, "key", in.Key, "records", in.Records, "error", err)
	}
	in.Bucket, in.UploadID = s.bucket, ""
	if err := putIntent(ctx, st, ik, in); err != nil {
		return false, fatal("%w", err)
	}
	return false, nil
}
