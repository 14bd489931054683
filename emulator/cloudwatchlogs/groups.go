package cloudwatchlogs

import (
	"encoding/base64"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

var (
	groupNameRE  = regexp.MustCompile(`^[.\-_/#A-Za-z0-9]+$`)
	identifierRE = regexp.MustCompile(`^[\w#+=/:,.@-]*$`)
	// tagRE is the pattern of a tag's key (one character or more) and
	// value (none or more).
	tagRE = regexp.MustCompile(`^[\p{L}\p{Z}\p{N}_.:/=+\-@]*$`)
)

const groupNamePattern = `[\.\-_/#A-Za-z0-9]+`

// retentionDays is the set PutRetentionPolicy accepts.
var retentionDays = []int32{1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653}

func checkLength(v, path string, lo, hi int) *apiError {
	n := utf8.RuneCountInString(v)
	if n < lo {
		return validation(v, path, "Member must have length greater than or equal to "+strconv.Itoa(lo))
	}
	if n > hi {
		return validation(v, path, "Member must have length less than or equal to "+strconv.Itoa(hi))
	}
	return nil
}

func checkGroupName(path string, name *string) *apiError {
	if name == nil {
		return notNull(path)
	}
	if e := checkLength(*name, path, 1, 512); e != nil {
		return e
	}
	if !groupNameRE.MatchString(*name) {
		return validation(*name, path, "Member must satisfy regular expression pattern: "+groupNamePattern)
	}
	return nil
}

func checkStreamName(path string, name *string) *apiError {
	if name == nil {
		return notNull(path)
	}
	if e := checkLength(*name, path, 1, 512); e != nil {
		return e
	}
	if strings.ContainsAny(*name, ":*") {
		return validation(*name, path, "Member must satisfy regular expression pattern: [^:*]*")
	}
	return nil
}

func checkLimit(limit *int32, hi int32) *apiError {
	if limit == nil {
		return nil
	}
	if *limit < 1 {
		return validation(*limit, "limit", "Member must have value greater than or equal to 1")
	}
	if *limit > hi {
		return validation(*limit, "limit", "Member must have value less than or equal to "+strconv.Itoa(int(hi)))
	}
	return nil
}

// resolveGroup accepts logGroupName or logGroupIdentifier (a name, or an ARN
// without the trailing ":*", which the identifier's pattern does not allow),
// not both, and returns the name.
func resolveGroup(name, identifier *string) (string, *apiError) {
	switch {
	case name != nil && identifier != nil:
		return "", invalidParam("LogGroup name and LogGroup ARN are mutually exclusive parameters.")
	case name != nil:
		return *name, checkGroupName("logGroupName", name)
	case identifier == nil:
		return "", notNull("logGroupName")
	}
	id := *identifier
	if e := checkLength(id, "logGroupIdentifier", 1, 2048); e != nil {
		return "", e
	}
	if !identifierRE.MatchString(id) {
		return "", validation(id, "logGroupIdentifier", `Member must satisfy regular expression pattern: [\w#+=/:,.@-]*`)
	}
	if strings.HasPrefix(id, "arn:") {
		// arn:PARTITION:logs:REGION:ACCOUNT:log-group:NAME
		parts := strings.SplitN(id, ":", 7)
		if len(parts) != 7 || parts[2] != "logs" || parts[5] != "log-group" {
			return "", invalidParam("The specified log group ARN is invalid.")
		}
		id = parts[6]
	}
	return id, checkGroupName("logGroupIdentifier", &id)
}

func encodeToken(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func decodeToken(tok, kind string) (string, bool) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return "", false
	}
	return strings.CutPrefix(string(b), kind+"/")
}

type createLogGroupIn struct {
	LogGroupName  *string           `json:"logGroupName"`
	KmsKeyID      *string           `json:"kmsKeyId"`
	LogGroupClass *string           `json:"logGroupClass"`
	Tags          map[string]string `json:"tags"`
}

func (s *Server) createLogGroup(body []byte) (any, *apiError) {
	var class, kms string
	return serve(s, body, handler[createLogGroupIn]{write: true, find: findNothing,
		check: func(in *createLogGroupIn) (string, string, *apiError) {
			if e := checkGroupName("logGroupName", in.LogGroupName); e != nil {
				return "", "", e
			}
			name := *in.LogGroupName
			if strings.HasPrefix(name, "aws/") {
				return "", "", invalidParam("Log group names can't start with the string 'aws/'.")
			}
			class = "STANDARD"
			if in.LogGroupClass != nil {
				class = *in.LogGroupClass
				if class != "STANDARD" && class != "INFREQUENT_ACCESS" {
					return "", "", validation(class, "logGroupClass", "Member must satisfy enum value set: [STANDARD, INFREQUENT_ACCESS]")
				}
			}
			if in.KmsKeyID != nil {
				kms = *in.KmsKeyID
				if e := checkLength(kms, "kmsKeyId", 0, 256); e != nil {
					return "", "", e
				}
			}
			if in.Tags != nil {
				if len(in.Tags) < 1 || len(in.Tags) > 50 {
					return "", "", validation("{...}", "tags", "Member must have length between 1 and 50")
				}
				for k, v := range in.Tags {
					if e := checkLength(k, "tags", 1, 128); e != nil {
						return "", "", e
					}
					if e := checkLength(v, "tags."+k, 0, 256); e != nil {
						return "", "", e
					}
					if !tagRE.MatchString(k) {
						return "", "", validation(k, "tags", `Member must satisfy regular expression pattern: ^([\p{L}\p{Z}\p{N}_.:/=+\-@]+)$`)
					}
					if !tagRE.MatchString(v) {
						return "", "", validation(v, "tags."+k, `Member must satisfy regular expression pattern: ^([\p{L}\p{Z}\p{N}_.:/=+\-@]*)$`)
					}
				}
			}
			return name, "", nil
		},
		run: func(in *createLogGroupIn, _ *group, _ *stream) (any, *apiError) {
			name := *in.LogGroupName
			if _, ok := s.groups[name]; ok {
				return nil, clientErr("ResourceAlreadyExistsException", "The specified log group already exists")
			}
			g := &group{name: name, created: s.nowMs(), class: class, kms: kms, tags: map[string]string{}, streams: map[string]*stream{}}
			for k, v := range in.Tags {
				g.tags[k] = v
			}
			s.groups[name] = g
			return nil, nil
		}})
}

type streamIn struct {
	LogGroupName  *string `json:"logGroupName"`
	LogStreamName *string `json:"logStreamName"`
}

func (s *Server) createLogStream(body []byte) (any, *apiError) {
	return serve(s, body, handler[streamIn]{write: true, find: findGroup,
		check: func(in *streamIn) (string, string, *apiError) {
			return checkGroupAndStream(in.LogGroupName, in.LogStreamName)
		},
		run: func(in *streamIn, g *group, _ *stream) (any, *apiError) {
			if _, ok := g.streams[*in.LogStreamName]; ok {
				return nil, clientErr("ResourceAlreadyExistsException", "The specified log stream already exists")
			}
			g.streams[*in.LogStreamName] = &stream{name: *in.LogStreamName, created: s.nowMs()}
			return nil, nil
		}})
}

func (s *Server) deleteLogStream(body []byte) (any, *apiError) {
	return serve(s, body, handler[streamIn]{write: true, find: findStream,
		check: func(in *streamIn) (string, string, *apiError) {
			return checkGroupAndStream(in.LogGroupName, in.LogStreamName)
		},
		run: func(in *streamIn, g *group, _ *stream) (any, *apiError) {
			delete(g.streams, *in.LogStreamName)
			return nil, nil
		}})
}

type groupIn struct {
	LogGroupName    *string `json:"logGroupName"`
	RetentionInDays *int32  `json:"retentionInDays"`
}

// checkGroupIn validates logGroupName and names it.
func checkGroupIn(in *groupIn) (string, string, *apiError) {
	if e := checkGroupName("logGroupName", in.LogGroupName); e != nil {
		return "", "", e
	}
	return *in.LogGroupName, "", nil
}

func (s *Server) deleteLogGroup(body []byte) (any, *apiError) {
	return serve(s, body, handler[groupIn]{write: true, find: findGroup, check: checkGroupIn,
		run: func(in *groupIn, _ *group, _ *stream) (any, *apiError) {
			delete(s.groups, *in.LogGroupName)
			return nil, nil
		}})
}

func (s *Server) putRetentionPolicy(body []byte) (any, *apiError) {
	return serve(s, body, handler[groupIn]{write: true, find: findGroup,
		check: func(in *groupIn) (string, string, *apiError) {
			name, _, e := checkGroupIn(in)
			if e != nil {
				return "", "", e
			}
			if in.RetentionInDays == nil {
				return "", "", notNull("retentionInDays")
			}
			days := *in.RetentionInDays
			valid := false
			for _, d := range retentionDays {
				valid = valid || d == days
			}
			if !valid {
				set := make([]string, len(retentionDays))
				for i, d := range retentionDays {
					set[i] = strconv.Itoa(int(d))
				}
				return "", "", validation(days, "retentionInDays", "Member must satisfy enum value set: ["+strings.Join(set, ", ")+"]")
			}
			return name, "", nil
		},
		run: func(in *groupIn, g *group, _ *stream) (any, *apiError) {
			g.retention = *in.RetentionInDays
			return nil, nil
		}})
}

func (s *Server) deleteRetentionPolicy(body []byte) (any, *apiError) {
	return serve(s, body, handler[groupIn]{write: true, find: findGroup, check: checkGroupIn,
		run: func(_ *groupIn, g *group, _ *stream) (any, *apiError) {
			g.retention = 0
			return nil, nil
		}})
}

type describeLogGroupsIn struct {
	LogGroupNamePrefix  *string `json:"logGroupNamePrefix"`
	LogGroupNamePattern *string `json:"logGroupNamePattern"`
	LogGroupClass       *string `json:"logGroupClass"`
	NextToken           *string `json:"nextToken"`
	Limit               *int32  `json:"limit"`
}

type logGroupOut struct {
	LogGroupName      string `json:"logGroupName"`
	CreationTime      int64  `json:"creationTime"`
	RetentionInDays   *int32 `json:"retentionInDays,omitempty"`
	MetricFilterCount int32  `json:"metricFilterCount"`
	Arn               string `json:"arn"`
	LogGroupArn       string `json:"logGroupArn"`
	StoredBytes       int64  `json:"storedBytes"`
	KmsKeyID          string `json:"kmsKeyId,omitempty"`
	LogGroupClass     string `json:"logGroupClass"`
}

type describeLogGroupsOut struct {
	LogGroups []logGroupOut `json:"logGroups"`
	NextToken *string       `json:"nextToken,omitempty"`
}

func (s *Server) describeLogGroups(body []byte) (any, *apiError) {
	var prefix, after string
	var limit int
	return serve(s, body, handler[describeLogGroupsIn]{find: findNothing,
		check: func(in *describeLogGroupsIn) (string, string, *apiError) {
			if in.LogGroupNamePattern != nil {
				return "", "", invalidParam("logGroupNamePattern is not supported by this emulator; use logGroupNamePrefix.")
			}
			if in.LogGroupNamePrefix != nil {
				if e := checkGroupName("logGroupNamePrefix", in.LogGroupNamePrefix); e != nil {
					return "", "", e
				}
				prefix = *in.LogGroupNamePrefix
			}
			if in.LogGroupClass != nil && *in.LogGroupClass != "STANDARD" && *in.LogGroupClass != "INFREQUENT_ACCESS" {
				return "", "", validation(*in.LogGroupClass, "logGroupClass", "Member must satisfy enum value set: [STANDARD, INFREQUENT_ACCESS]")
			}
			if e := checkLimit(in.Limit, 50); e != nil {
				return "", "", e
			}
			limit = 50
			if in.Limit != nil {
				limit = int(*in.Limit)
			}
			if in.NextToken != nil {
				var ok bool
				if after, ok = decodeToken(*in.NextToken, "g"); !ok || after == "" {
					return "", "", badNextToken()
				}
			}
			return "", "", nil
		},
		run: func(in *describeLogGroupsIn, _ *group, _ *stream) (any, *apiError) {
			var groups []*group
			for name, g := range s.groups {
				if strings.HasPrefix(name, prefix) && name > after &&
					(in.LogGroupClass == nil || *in.LogGroupClass == g.class) {
					groups = append(groups, g)
				}
			}
			sort.Slice(groups, func(i, j int) bool { return groups[i].name < groups[j].name })
			out := describeLogGroupsOut{LogGroups: []logGroupOut{}}
			for i, g := range groups {
				if i == limit {
					tok := encodeToken("g/" + groups[i-1].name)
					out.NextToken = &tok
					break
				}
				o := logGroupOut{
					LogGroupName:  g.name,
					CreationTime:  g.created,
					Arn:           s.groupArn(g.name) + ":*",
					LogGroupArn:   s.groupArn(g.name),
					KmsKeyID:      g.kms,
					LogGroupClass: g.class,
				}
				if g.retention > 0 {
					r := g.retention
					o.RetentionInDays = &r
				}
				for _, st := range g.streams {
					st.mu.Lock()
					o.StoredBytes += st.bytes
					st.mu.Unlock()
				}
				out.LogGroups = append(out.LogGroups, o)
			}
			return out, nil
		}})
}

type describeLogStreamsIn struct {
	LogGroupName        *string `json:"logGroupName"`
	LogGroupIdentifier  *string `json:"logGroupIdentifier"`
	LogStreamNamePrefix *string `json:"logStreamNamePrefix"`
	OrderBy             *string `json:"orderBy"`
	Descending          *bool   `json:"descending"`
	NextToken           *string `json:"nextToken"`
	Limit               *int32  `json:"limit"`
}

type logStreamOut struct {
	LogStreamName       string `json:"logStreamName"`
	CreationTime        int64  `json:"creationTime"`
	FirstEventTimestamp *int64 `json:"firstEventTimestamp,omitempty"`
	LastEventTimestamp  *int64 `json:"lastEventTimestamp,omitempty"`
	LastIngestionTime   *int64 `json:"lastIngestionTime,omitempty"`
	UploadSequenceToken string `json:"uploadSequenceToken,omitempty"`
	Arn                 string `json:"arn"`
	StoredBytes         int64  `json:"storedBytes"`
}

type describeLogStreamsOut struct {
	LogStreams []logStreamOut `json:"logStreams"`
	NextToken  *string        `json:"nextToken,omitempty"`
}

func (s *Server) describeLogStreams(body []byte) (any, *apiError) {
	var prefix, cursor string
	var byTime, desc bool
	var limit, offset int
	return serve(s, body, handler[describeLogStreamsIn]{find: findGroup,
		check: func(in *describeLogStreamsIn) (string, string, *apiError) {
			groupName, e := resolveGroup(in.LogGroupName, in.LogGroupIdentifier)
			if e != nil {
				return "", "", e
			}
			if in.LogStreamNamePrefix != nil {
				if e := checkStreamName("logStreamNamePrefix", in.LogStreamNamePrefix); e != nil {
					return "", "", e
				}
				prefix = *in.LogStreamNamePrefix
			}
			if in.OrderBy != nil {
				switch *in.OrderBy {
				case "LogStreamName":
				case "LastEventTime":
					byTime = true
				default:
					return "", "", validation(*in.OrderBy, "orderBy", "Member must satisfy enum value set: [LogStreamName, LastEventTime]")
				}
			}
			if byTime && in.LogStreamNamePrefix != nil {
				return "", "", invalidParam("Cannot order by LastEventTime with a logStreamNamePrefix.")
			}
			desc = in.Descending != nil && *in.Descending
			if e := checkLimit(in.Limit, 50); e != nil {
				return "", "", e
			}
			limit = 50
			if in.Limit != nil {
				limit = int(*in.Limit)
			}
			cursor, offset = "", 0
			if in.NextToken != nil {
				var ok bool
				if byTime {
					var v string
					if v, ok = decodeToken(*in.NextToken, "o"); ok {
						var err error
						offset, err = strconv.Atoi(v)
						ok = err == nil && offset >= 0
					}
				} else {
					cursor, ok = decodeToken(*in.NextToken, "n")
					ok = ok && cursor != ""
				}
				if !ok {
					return "", "", badNextToken()
				}
			}
			return groupName, "", nil
		},
		run: func(in *describeLogStreamsIn, g *group, _ *stream) (any, *apiError) {
			type row struct {
				out  logStreamOut
				last int64
			}
			var rows []row
			for name, st := range g.streams {
				if !strings.HasPrefix(name, prefix) {
					continue
				}
				if cursor != "" && ((!desc && name <= cursor) || (desc && name >= cursor)) {
					continue
				}
				si := st.info()
				o := logStreamOut{
					LogStreamName: name,
					CreationTime:  si.CreationTime,
					Arn:           s.streamArn(g.name, name),
				}
				if si.Events > 0 {
					o.FirstEventTimestamp, o.LastEventTimestamp = &si.FirstEventTimestamp, &si.LastEventTimestamp
					o.LastIngestionTime = &si.LastIngestionTime
				}
				st.mu.Lock()
				o.UploadSequenceToken = st.token()
				st.mu.Unlock()
				rows = append(rows, row{o, si.LastEventTimestamp})
			}
			sort.Slice(rows, func(i, j int) bool {
				a, b := rows[i], rows[j]
				if byTime && a.last != b.last {
					return (a.last < b.last) != desc
				}
				return (a.out.LogStreamName < b.out.LogStreamName) != desc
			})
			if byTime {
				rows = rows[min(offset, len(rows)):]
			}
			out := describeLogStreamsOut{LogStreams: []logStreamOut{}}
			for i, r := range rows {
				if i == limit {
					var tok string
					if byTime {
						tok = encodeToken("o/" + strconv.Itoa(offset+limit))
					} else {
						tok = encodeToken("n/" + rows[i-1].out.LogStreamName)
					}
					out.NextToken = &tok
					break
				}
				out.LogStreams = append(out.LogStreams, r.out)
			}
			return out, nil
		}})
}
