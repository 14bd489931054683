package s3emu

import (
	"bytes"
	"crypto/md5"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/johannesboyne/gofakes3"
	bolt "go.etcd.io/bbolt"
)

// diskBackend is a gofakes3.Backend in one bbolt file, for a dev mode whose
// objects survive restarts. (gofakes3's own s3bolt and s3afero backends
// need modules this project does not use.) Layout:
//
//	_buckets            bucket name → JSON {"created": time}
//	<bucket>/meta       object key → JSON diskObject (no contents)
//	<bucket>/data       object key → contents
//
// Keys sort as bytes, which is S3's listing order (UTF-8 binary).
type diskBackend struct {
	db *bolt.DB
}

var _ gofakes3.Backend = (*diskBackend)(nil)

var (
	bucketsName = []byte("_buckets") // "_" is not a valid first character of an S3 bucket name
	metaName    = []byte("meta")
	dataName    = []byte("data")
)

type diskBucket struct {
	Created time.Time `json:"created"`
}

type diskObject struct {
	Metadata map[string]string `json:"metadata"`
	Size     int64             `json:"size"`
	Modified time.Time         `json:"modified"`
	MD5      []byte            `json:"md5"`
}

func openDisk(path string) (*diskBackend, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("create emulator directory: %w", err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, fmt.Errorf("open emulator store %s: %w", path, err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(bucketsName)
		return err
	}); err != nil {
		db.Close()
		return nil, fmt.Errorf("initialise emulator store %s: %w", path, err)
	}
	return &diskBackend{db: db}, nil
}

func (d *diskBackend) close() error { return d.db.Close() }

// objects returns the meta and data buckets of an S3 bucket, or
// NoSuchBucket.
func objects(tx *bolt.Tx, bucket string) (meta, data *bolt.Bucket, err error) {
	b := tx.Bucket([]byte(bucket))
	if b == nil || bucket == string(bucketsName) {
		return nil, nil, gofakes3.BucketNotFound(bucket)
	}
	return b.Bucket(metaName), b.Bucket(dataName), nil
}

func (d *diskBackend) ListBuckets() ([]gofakes3.BucketInfo, error) {
	var out []gofakes3.BucketInfo
	err := d.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketsName).ForEach(func(k, v []byte) error {
			var b diskBucket
			_ = json.Unmarshal(v, &b)
			out = append(out, gofakes3.BucketInfo{Name: string(k), CreationDate: gofakes3.NewContentTime(b.Created)})
			return nil
		})
	})
	return out, err
}

func (d *diskBackend) ListBucket(name string, prefix *gofakes3.Prefix, page gofakes3.ListBucketPage) (*gofakes3.ObjectList, error) {
	if prefix == nil {
		prefix = &gofakes3.Prefix{}
	}
	list := gofakes3.NewObjectList()
	err := d.db.View(func(tx *bolt.Tx) error {
		meta, _, err := objects(tx, name)
		if err != nil {
			return err
		}
		c := meta.Cursor()
		k, v := c.First()
		if page.HasMarker {
			k, v = c.Seek([]byte(page.Marker))
			if string(k) == page.Marker {
				k, v = c.Next()
			}
		}
		var (
			count      int64
			lastPrefix string
			lastKey    string
			match      gofakes3.PrefixMatch
		)
		for ; k != nil; k, v = c.Next() {
			key := string(k)
			if !prefix.Match(key, &match) {
				continue
			}
			if match.CommonPrefix {
				if match.MatchedPart == lastPrefix {
					lastKey = key
					continue
				}
				list.AddPrefix(match.MatchedPart)
				lastPrefix = match.MatchedPart
			} else {
				var o diskObject
				if err := json.Unmarshal(v, &o); err != nil {
					return fmt.Errorf("decode object %q: %w", key, err)
				}
				list.Add(&gofakes3.Content{
					Key:          key,
					ETag:         gofakes3.FormatETag(o.MD5),
					Size:         o.Size,
					LastModified: gofakes3.NewContentTime(o.Modified.UTC()),
				})
			}
			lastKey = key
			count++
			if page.MaxKeys > 0 && count >= page.MaxKeys {
				// More only if a later key adds something new: keys under
				// the common prefix just added do not.
				for nk, _ := c.Next(); nk != nil; nk, _ = c.Next() {
					var m gofakes3.PrefixMatch
					if !prefix.Match(string(nk), &m) {
						continue
					}
					if m.CommonPrefix && m.MatchedPart == lastPrefix {
						lastKey = string(nk)
						continue
					}
					list.IsTruncated, list.NextMarker = true, lastKey
					break
				}
				break
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return list, nil
}

func (d *diskBackend) CreateBucket(name string) error {
	return d.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket([]byte(name)) != nil {
			return gofakes3.ResourceError(gofakes3.ErrBucketAlreadyExists, name)
		}
		b, err := tx.CreateBucket([]byte(name))
		if err != nil {
			return err
		}
		if _, err := b.CreateBucket(metaName); err != nil {
			return err
		}
		if _, err := b.CreateBucket(dataName); err != nil {
			return err
		}
		v, _ := json.Marshal(diskBucket{Created: time.Now().UTC()})
		return tx.Bucket(bucketsName).Put([]byte(name), v)
	})
}

func (d *diskBackend) BucketExists(name string) (bool, error) {
	exists := false
	err := d.db.View(func(tx *bolt.Tx) error {
		exists = tx.Bucket(bucketsName).Get([]byte(name)) != nil
		return nil
	})
	return exists, err
}

func (d *diskBackend) DeleteBucket(name string) error {
	return d.db.Update(func(tx *bolt.Tx) error {
		meta, _, err := objects(tx, name)
		if err != nil {
			return err
		}
		if k, _ := meta.Cursor().First(); k != nil {
			return gofakes3.ResourceError(gofakes3.ErrBucketNotEmpty, name)
		}
		return deleteBucket(tx, name)
	})
}

func (d *diskBackend) ForceDeleteBucket(name string) error {
	return d.db.Update(func(tx *bolt.Tx) error {
		if _, _, err := objects(tx, name); err != nil {
			return err
		}
		return deleteBucket(tx, name)
	})
}

func deleteBucket(tx *bolt.Tx, name string) error {
	if err := tx.Bucket(bucketsName).Delete([]byte(name)); err != nil {
		return err
	}
	return tx.DeleteBucket([]byte(name))
}

func (d *diskBackend) HeadObject(bucket, key string) (*gofakes3.Object, error) {
	return d.get(bucket, key, nil, false)
}

func (d *diskBackend) GetObject(bucket, key string, rng *gofakes3.ObjectRangeRequest) (*gofakes3.Object, error) {
	return d.get(bucket, key, rng, true)
}

func (d *diskBackend) get(bucket, key string, rng *gofakes3.ObjectRangeRequest, contents bool) (*gofakes3.Object, error) {
	var (
		o    diskObject
		body []byte
	)
	err := d.db.View(func(tx *bolt.Tx) error {
		meta, data, err := objects(tx, bucket)
		if err != nil {
			return err
		}
		v := meta.Get([]byte(key))
		if v == nil {
			return gofakes3.KeyNotFound(key)
		}
		if err := json.Unmarshal(v, &o); err != nil {
			return fmt.Errorf("decode object %q: %w", key, err)
		}
		if contents {
			body = bytes.Clone(data.Get([]byte(key)))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	r, err := rng.Range(o.Size)
	if err != nil {
		return nil, err
	}
	if r != nil && contents {
		body = body[r.Start : r.Start+r.Length]
	}
	return &gofakes3.Object{
		Name:     key,
		Metadata: o.Metadata,
		Size:     o.Size,
		Contents: io.NopCloser(bytes.NewReader(body)),
		Range:    r,
		Hash:     o.MD5,
	}, nil
}

// PutObject replaces the object and its metadata, as S3 does.
func (d *diskBackend) PutObject(bucket, key string, meta map[string]string, input io.Reader, size int64, conds *gofakes3.PutConditions) (gofakes3.PutObjectResult, error) {
	body, err := gofakes3.ReadAll(input, size)
	if err != nil {
		return gofakes3.PutObjectResult{}, err
	}
	sum := md5.Sum(body)
	v, err := json.Marshal(diskObject{Metadata: meta, Size: int64(len(body)), Modified: time.Now().UTC(), MD5: sum[:]})
	if err != nil {
		return gofakes3.PutObjectResult{}, err
	}
	err = d.db.Update(func(tx *bolt.Tx) error {
		m, data, err := objects(tx, bucket)
		if err != nil {
			return err
		}
		if conds != nil {
			info := &gofakes3.ConditionalObjectInfo{}
			if old := m.Get([]byte(key)); old != nil {
				var o diskObject
				if err := json.Unmarshal(old, &o); err != nil {
					return fmt.Errorf("decode object %q: %w", key, err)
				}
				info.Exists, info.Hash = true, o.MD5
			}
			if err := gofakes3.CheckPutConditions(conds, info); err != nil {
				return err
			}
		}
		if err := m.Put([]byte(key), v); err != nil {
			return err
		}
		return data.Put([]byte(key), body)
	})
	return gofakes3.PutObjectResult{}, err
}

func (d *diskBackend) CopyObject(srcBucket, srcKey, dstBucket, dstKey string, meta map[string]string) (gofakes3.CopyObjectResult, error) {
	return gofakes3.CopyObject(d, srcBucket, srcKey, dstBucket, dstKey, meta)
}

func (d *diskBackend) DeleteObject(bucket, key string) (gofakes3.ObjectDeleteResult, error) {
	return gofakes3.ObjectDeleteResult{}, d.db.Update(func(tx *bolt.Tx) error {
		meta, data, err := objects(tx, bucket)
		if err != nil {
			return err
		}
		if err := meta.Delete([]byte(key)); err != nil {
			return err
		}
		return data.Delete([]byte(key))
	})
}

func (d *diskBackend) DeleteMulti(bucket string, keys ...string) (gofakes3.MultiDeleteResult, error) {
	var res gofakes3.MultiDeleteResult
	err := d.db.Update(func(tx *bolt.Tx) error {
		meta, data, err := objects(tx, bucket)
		if err != nil {
			return err
		}
		for _, k := range keys {
			if err := errors.Join(meta.Delete([]byte(k)), data.Delete([]byte(k))); err != nil {
				res.Error = append(res.Error, gofakes3.ErrorResult{Key: k, Code: gofakes3.ErrInternal, Message: err.Error()})
				continue
			}
			res.Deleted = append(res.Deleted, gofakes3.ObjectID{Key: k})
		}
		return nil
	})
	return res, err
}
