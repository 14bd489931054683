package cloudwatchlogs

// lookup is what a handler needs found before it runs.
type lookup int

const (
	findNothing lookup = iota // no group (CreateLogGroup, DescribeLogGroups)
	findGroup                 // the group must exist: else ResourceNotFoundException
	findStream                // the group, then the stream, must exist
)

// handler is one operation's request handling: check validates the
// decoded request, before any lock, and names the group and stream it is
// about; run does the work with s.mu held (for writing when write is set)
// and the group and stream found.
type handler[T any] struct {
	write bool
	find  lookup
	check func(in *T) (group, stream string, e *apiError)
	run   func(in *T, g *group, st *stream) (any, *apiError)
}

// serve is every operation's preamble, in this order: decode the body
// (SerializationException), validate (check), lock, look up the group and
// the stream (ResourceNotFoundException), then run.
func serve[T any](s *Server, body []byte, h handler[T]) (any, *apiError) {
	var in T
	if e := decode(body, &in); e != nil {
		return nil, e
	}
	groupName, streamName, e := h.check(&in)
	if e != nil {
		return nil, e
	}
	if h.write {
		s.mu.Lock()
		defer s.mu.Unlock()
	} else {
		s.mu.RLock()
		defer s.mu.RUnlock()
	}
	var g *group
	var st *stream
	if h.find >= findGroup {
		if g = s.groups[groupName]; g == nil {
			return nil, groupNotFound()
		}
	}
	if h.find == findStream {
		if st = g.streams[streamName]; st == nil {
			return nil, streamNotFound()
		}
	}
	return h.run(&in, g, st)
}

// checkGroupAndStream validates logGroupName and logStreamName and names them.
func checkGroupAndStream(groupName, streamName *string) (string, string, *apiError) {
	if e := checkGroupName("logGroupName", groupName); e != nil {
		return "", "", e
	}
	if e := checkStreamName("logStreamName", streamName); e != nil {
		return "", "", e
	}
	return *groupName, *streamName, nil
}
