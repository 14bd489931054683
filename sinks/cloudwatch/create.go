package cloudwatch

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs/types"

	"github.com/logfwd/forwarder/sinks"
)

// create makes the group (when the sink may and it is not known to exist)
// and the stream.
func (s *Sink) create(ctx context.Context, group, stream string) error {
	groupKey := "\x00group\x00" + group
	if _, known := s.known.get(groupKey); s.cfg.CreateGroup && !known {
		if err := s.createGroup(ctx, group); err != nil {
			return classify(err, group, stream)
		}
		s.known.put(groupKey, "")
	}
	if !s.cfg.CreateStream {
		return sinks.NewSinkPermanent("ResourceNotFoundException", fmt.Errorf(
			"log stream %q of group %q does not exist and create_stream is false: create it or set create_stream: true in sink %q", stream, group, s.name))
	}
	_, err := s.api.CreateLogStream(ctx, &cloudwatchlogs.CreateLogStreamInput{LogGroupName: aws.String(group), LogStreamName: aws.String(stream)})
	var exists *types.ResourceAlreadyExistsException
	var missing *types.ResourceNotFoundException
	switch {
	case err == nil:
		s.m.created.Inc()
		return nil
	case errors.As(err, &exists):
		return nil
	case errors.As(err, &missing) && s.cfg.CreateGroup:
		s.known.delete(groupKey) // deleted behind our back: create it on the next try
		return sinks.NewRetryable("ResourceNotFoundException", fmt.Errorf("log group %q vanished: %w", group, err))
	case errors.As(err, &missing):
		return sinks.NewSinkPermanent("ResourceNotFoundException", fmt.Errorf(
			"log group %q does not exist and create_group is false: create the group or set create_group: true in sink %q", group, s.name))
	}
	return classify(err, group, stream)
}

func (s *Sink) createGroup(ctx context.Context, group string) error {
	in := &cloudwatchlogs.CreateLogGroupInput{LogGroupName: aws.String(group)}
	if s.cfg.LogGroupClass != "" {
		in.LogGroupClass = types.LogGroupClass(s.cfg.LogGroupClass)
	}
	if s.cfg.KMSKeyID != "" {
		in.KmsKeyId = aws.String(s.cfg.KMSKeyID)
	}
	if len(s.cfg.Tags) > 0 {
		in.Tags = s.cfg.Tags
	}
	_, err := s.api.CreateLogGroup(ctx, in)
	var exists *types.ResourceAlreadyExistsException
	switch {
	case errors.As(err, &exists):
		return nil // someone else made it; its settings are theirs
	case err != nil:
		return err
	}
	s.m.created.Inc()
	s.log.Info("created log group", "sink", s.name, "group", group, "retention_days", s.cfg.RetentionDays, "class", s.cfg.LogGroupClass)
	if s.cfg.RetentionDays > 0 {
		_, err = s.api.PutRetentionPolicy(ctx, &cloudwatchlogs.PutRetentionPolicyInput{
			LogGroupName: aws.String(group), RetentionInDays: aws.Int32(int32(s.cfg.RetentionDays))})
	}
	return err
}
