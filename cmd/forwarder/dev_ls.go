package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

const devLsUsage = `Usage: forwarder dev ls

List what arrived in the emulators of a running "forwarder dev": S3 objects with their
sizes, CloudWatch Logs groups and streams with their event counts.
`

func cmdDevLs(args []string, stdout, stderr io.Writer) int {
	f := newFlagSet("dev ls", devLsUsage)
	offset := f.Int("port-offset", 0, "the `N` the dev instance was started with")
	pos, code, done := f.parse(args, stdout, stderr)
	if done {
		return code
	}
	if code, done := f.noArgs(pos, stderr); done {
		return code
	}
	ports, err := newDevPorts(*offset)
	if err != nil {
		fmt.Fprintf(stderr, "forwarder dev ls: %v\n", err)
		return exitUsage
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	awsCfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("dev", "dev", "")}
	s3URL, cwURL := "http://"+ports.s3, "http://"+ports.cw

	sc := s3.NewFromConfig(awsCfg, func(o *s3.Options) { o.BaseEndpoint = aws.String(s3URL); o.UsePathStyle = true })
	buckets, err := sc.ListBuckets(ctx, &s3.ListBucketsInput{})
	if err != nil {
		fmt.Fprintf(stderr, "forwarder dev ls: no forwarder dev answers on %s (start one: make run, or forwarder dev): %v\n", ports.s3, err)
		return exitFail
	}
	fmt.Fprintf(stdout, "S3 %s:\n", s3URL)
	for _, b := range buckets.Buckets {
		fmt.Fprintf(stdout, "  bucket %s:\n", aws.ToString(b.Name))
		n, total := 0, int64(0)
		p := s3.NewListObjectsV2Paginator(sc, &s3.ListObjectsV2Input{Bucket: b.Name})
		for p.HasMorePages() {
			page, err := p.NextPage(ctx)
			if err != nil {
				fmt.Fprintf(stderr, "forwarder dev ls: list bucket %s: %v\n", aws.ToString(b.Name), err)
				return exitFail
			}
			for _, o := range page.Contents {
				fmt.Fprintf(stdout, "    %s  %d bytes\n", aws.ToString(o.Key), aws.ToInt64(o.Size))
				n++
				total += aws.ToInt64(o.Size)
			}
		}
		fmt.Fprintf(stdout, "    %s, %s\n", plural(n, "object", "objects"), humanBytes(total))
	}

	cc := cloudwatchlogs.NewFromConfig(awsCfg, func(o *cloudwatchlogs.Options) { o.BaseEndpoint = aws.String(cwURL) })
	fmt.Fprintf(stdout, "CloudWatch Logs %s:\n", cwURL)
	gp := cloudwatchlogs.NewDescribeLogGroupsPaginator(cc, &cloudwatchlogs.DescribeLogGroupsInput{})
	groups := 0
	for gp.HasMorePages() {
		page, err := gp.NextPage(ctx)
		if err != nil {
			fmt.Fprintf(stderr, "forwarder dev ls: no forwarder dev answers on %s (start one: make run, or forwarder dev): %v\n", ports.cw, err)
			return exitFail
		}
		for _, g := range page.LogGroups {
			groups++
			retention := "never expires"
			if g.RetentionInDays != nil {
				retention = "retention " + plural(int(*g.RetentionInDays), "day", "days")
			}
			fmt.Fprintf(stdout, "  %s (%s)\n", aws.ToString(g.LogGroupName), retention)
			sp := cloudwatchlogs.NewDescribeLogStreamsPaginator(cc, &cloudwatchlogs.DescribeLogStreamsInput{LogGroupName: g.LogGroupName})
			for sp.HasMorePages() {
				sPage, err := sp.NextPage(ctx)
				if err != nil {
					fmt.Fprintf(stderr, "forwarder dev ls: %v\n", err)
					return exitFail
				}
				for _, st := range sPage.LogStreams {
					events, err := countEvents(ctx, cc, g.LogGroupName, st.LogStreamName)
					if err != nil {
						fmt.Fprintf(stderr, "forwarder dev ls: %v\n", err)
						return exitFail
					}
					fmt.Fprintf(stdout, "    %s  %s\n", aws.ToString(st.LogStreamName), plural(events, "event", "events"))
				}
			}
		}
	}
	if groups == 0 {
		fmt.Fprintln(stdout, "  no log groups yet (records of tags the sink matches, kube.** or pod.**, make them)")
	}
	return exitOK
}

func countEvents(ctx context.Context, c *cloudwatchlogs.Client, group, stream *string) (int, error) {
	n := 0
	var token *string
	for {
		out, err := c.GetLogEvents(ctx, &cloudwatchlogs.GetLogEventsInput{LogGroupName: group, LogStreamName: stream,
			StartFromHead: aws.Bool(true), NextToken: token})
		if err != nil {
			return n, err
		}
		n += len(out.Events)
		if len(out.Events) == 0 || aws.ToString(out.NextForwardToken) == aws.ToString(token) {
			return n, nil
		}
		token = out.NextForwardToken
	}
}
