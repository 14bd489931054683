package cloudwatchlogs

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	cwl "github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatchlogs/types"
)

func TestCreateLogGroupNames(t *testing.T) {
	e := newEnv(t, Options{})
	ctx := context.Background()
	for _, name := range []string{"a", "/app/x.y-z_#1", "/aws/lambda/fn", strings.Repeat("g", 512)} {
		if _, err := e.cl.CreateLogGroup(ctx, &cwl.CreateLogGroupInput{LogGroupName: aws.String(name)}); err != nil {
			t.Errorf("CreateLogGroup(%.20q): %v", name, err)
		}
	}
	for _, c := range []struct{ name, msg string }{
		{"", "Member must have length greater than or equal to 1"},
		{strings.Repeat("g", 513), "Member must have length less than or equal to 512"},
		{"has space", "Member must satisfy regular expression pattern"},
		{"colon:x", "Member must satisfy regular expression pattern"},
		{"star*", "Member must satisfy regular expression pattern"},
		{"é", "Member must satisfy regular expression pattern"},
		{"aws/mine", "aws/"},
	} {
		_, err := e.cl.CreateLogGroup(ctx, &cwl.CreateLogGroupInput{LogGroupName: aws.String(c.name)})
		t.Run(fmt.Sprintf("%.20q", c.name), func(t *testing.T) { wantIPE(t, err, c.msg) })
	}
	_, err := e.cl.CreateLogGroup(ctx, &cwl.CreateLogGroupInput{LogGroupName: aws.String("a")})
	wantErr[*types.ResourceAlreadyExistsException](t, err, "The specified log group already exists")
	if n := len(e.srv.Groups()); n != 4 {
		t.Errorf("%d groups, want 4", n)
	}
}

func TestCreateLogGroupAttributes(t *testing.T) {
	e := newEnv(t, Options{})
	ctx := context.Background()
	kms := "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
	_, err := e.cl.CreateLogGroup(ctx, &cwl.CreateLogGroupInput{
		LogGroupName:  aws.String("ia"),
		LogGroupClass: types.LogGroupClassInfrequentAccess,
		KmsKeyId:      aws.String(kms),
		Tags:          map[string]string{"team": "logs", "env": "dev"},
	})
	if err != nil {
		t.Fatal(err)
	}
	e.mustGroup(t, "std")
	_, err = e.cl.CreateLogGroup(ctx, &cwl.CreateLogGroupInput{LogGroupName: aws.String("x"), LogGroupClass: "COLD"})
	wantIPE(t, err, "enum value set: [STANDARD, INFREQUENT_ACCESS]")
	_, err = e.cl.CreateLogGroup(ctx, &cwl.CreateLogGroupInput{LogGroupName: aws.String("x"), Tags: map[string]string{"": "v"}})
	wantIPE(t, err, "length greater than or equal to 1")
	_, err = e.cl.CreateLogGroup(ctx, &cwl.CreateLogGroupInput{LogGroupName: aws.String("x"), Tags: map[string]string{"owner": "My App (prod)"}})
	wantIPE(t, err, "Value 'My App (prod)' at 'tags.owner' failed to satisfy constraint: Member must satisfy regular expression pattern")
	_, err = e.cl.CreateLogGroup(ctx, &cwl.CreateLogGroupInput{LogGroupName: aws.String("x"), Tags: map[string]string{"a,b": "v"}})
	wantIPE(t, err, "Value 'a,b' at 'tags' failed to satisfy constraint: Member must satisfy regular expression pattern")

	groups := e.srv.Groups()
	want := []GroupInfo{
		{Name: "ia", CreationTime: fixedNow, Class: "INFREQUENT_ACCESS", KmsKeyID: kms, Tags: map[string]string{"team": "logs", "env": "dev"}},
		{Name: "std", CreationTime: fixedNow, Class: "STANDARD", Tags: map[string]string{}},
	}
	if !reflect.DeepEqual(groups, want) {
		t.Errorf("Groups() = %+v\nwant %+v", groups, want)
	}
	out, err := e.cl.DescribeLogGroups(ctx, &cwl.DescribeLogGroupsInput{})
	if err != nil {
		t.Fatal(err)
	}
	g := out.LogGroups[0]
	if aws.ToString(g.LogGroupName) != "ia" || g.LogGroupClass != types.LogGroupClassInfrequentAccess || aws.ToString(g.KmsKeyId) != kms ||
		aws.ToString(g.Arn) != "arn:aws:logs:us-east-1:123456789012:log-group:ia:*" || aws.ToString(g.LogGroupArn) != "arn:aws:logs:us-east-1:123456789012:log-group:ia" ||
		aws.ToInt64(g.CreationTime) != fixedNow || g.RetentionInDays != nil {
		t.Errorf("DescribeLogGroups()[0] = %+v", g)
	}
	if _, err = e.cl.CreateLogGroup(ctx, &cwl.CreateLogGroupInput{LogGroupName: aws.String("tagged"), Tags: map[string]string{"Équipe 1": "a_b.c:d/e=f+g-h@i", "empty": ""}}); err != nil {
		t.Errorf("tags of letters, spaces, digits and _.:/=+-@: %v", err)
	}
}

func TestCreateLogStreamNames(t *testing.T) {
	e := newEnv(t, Options{})
	ctx := context.Background()
	e.mustGroup(t, "g")
	for _, name := range []string{"s", "ns/pod-1 [x] é", strings.Repeat("s", 512)} {
		e.mustStream(t, "g", name)
	}
	for _, c := range []struct{ name, msg string }{
		{"", "Member must have length greater than or equal to 1"},
		{strings.Repeat("s", 513), "Member must have length less than or equal to 512"},
		{"a:b", "[^:*]*"},
		{"a*b", "[^:*]*"},
	} {
		_, err := e.cl.CreateLogStream(ctx, &cwl.CreateLogStreamInput{LogGroupName: aws.String("g"), LogStreamName: aws.String(c.name)})
		t.Run(fmt.Sprintf("%.20q", c.name), func(t *testing.T) { wantIPE(t, err, c.msg) })
	}
	_, err := e.cl.CreateLogStream(ctx, &cwl.CreateLogStreamInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("s")})
	wantErr[*types.ResourceAlreadyExistsException](t, err, "The specified log stream already exists")
	_, err = e.cl.CreateLogStream(ctx, &cwl.CreateLogStreamInput{LogGroupName: aws.String("nope"), LogStreamName: aws.String("s")})
	wantErr[*types.ResourceNotFoundException](t, err, "The specified log group does not exist.")
	_, err = e.cl.CreateLogStream(ctx, &cwl.CreateLogStreamInput{LogGroupName: aws.String("bad:group"), LogStreamName: aws.String("s")})
	wantIPE(t, err, "logGroupName")
}

func TestRetentionPolicy(t *testing.T) {
	e := newEnv(t, Options{})
	ctx := context.Background()
	e.mustGroup(t, "g")
	for _, d := range []int32{1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653} {
		if _, err := e.cl.PutRetentionPolicy(ctx, &cwl.PutRetentionPolicyInput{LogGroupName: aws.String("g"), RetentionInDays: aws.Int32(d)}); err != nil {
			t.Errorf("PutRetentionPolicy(%d): %v", d, err)
		}
	}
	for _, d := range []int32{0, 2, 10, 366, 3654, -1} {
		_, err := e.cl.PutRetentionPolicy(ctx, &cwl.PutRetentionPolicyInput{LogGroupName: aws.String("g"), RetentionInDays: aws.Int32(d)})
		t.Run(fmt.Sprint(d), func(t *testing.T) { wantIPE(t, err, "Member must satisfy enum value set: [1, 3, 5") })
	}
	_, err := e.cl.PutRetentionPolicy(ctx, &cwl.PutRetentionPolicyInput{LogGroupName: aws.String("nope"), RetentionInDays: aws.Int32(7)})
	wantErr[*types.ResourceNotFoundException](t, err, "log group")

	if _, err := e.cl.PutRetentionPolicy(ctx, &cwl.PutRetentionPolicyInput{LogGroupName: aws.String("g"), RetentionInDays: aws.Int32(14)}); err != nil {
		t.Fatal(err)
	}
	out, err := e.cl.DescribeLogGroups(ctx, &cwl.DescribeLogGroupsInput{})
	if err != nil {
		t.Fatal(err)
	}
	if r := aws.ToInt32(out.LogGroups[0].RetentionInDays); r != 14 {
		t.Errorf("retentionInDays = %d, want 14", r)
	}
	if r := e.srv.Groups()[0].RetentionInDays; r != 14 {
		t.Errorf("Groups() retention = %d, want 14", r)
	}
	if _, err := e.cl.DeleteRetentionPolicy(ctx, &cwl.DeleteRetentionPolicyInput{LogGroupName: aws.String("g")}); err != nil {
		t.Fatal(err)
	}
	if r := e.srv.Groups()[0].RetentionInDays; r != 0 {
		t.Errorf("retention after DeleteRetentionPolicy = %d, want 0", r)
	}
}

func TestDeleteLogGroupAndStream(t *testing.T) {
	e := newEnv(t, Options{})
	ctx := context.Background()
	e.mustGroup(t, "g")
	e.mustStream(t, "g", "s")
	e.mustStream(t, "g", "t")
	e.mustPut(t, "g", "s", ev(fixedNow, "one"))

	if _, err := e.cl.DeleteLogStream(ctx, &cwl.DeleteLogStreamInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("t")}); err != nil {
		t.Fatal(err)
	}
	_, err := e.cl.DeleteLogStream(ctx, &cwl.DeleteLogStreamInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("t")})
	wantErr[*types.ResourceNotFoundException](t, err, "The specified log stream does not exist.")

	if _, err := e.cl.DeleteLogGroup(ctx, &cwl.DeleteLogGroupInput{LogGroupName: aws.String("g")}); err != nil {
		t.Fatal(err)
	}
	_, err = e.put("g", "s", ev(fixedNow, "two"))
	wantErr[*types.ResourceNotFoundException](t, err, "The specified log group does not exist.")
	_, err = e.cl.DeleteLogGroup(ctx, &cwl.DeleteLogGroupInput{LogGroupName: aws.String("g")})
	wantErr[*types.ResourceNotFoundException](t, err, "The specified log group does not exist.")
	if g := e.srv.Groups(); len(g) != 0 {
		t.Errorf("Groups() = %+v, want none", g)
	}
	if evs := e.srv.Events("g", "s"); evs != nil {
		t.Errorf("Events of a deleted group = %v", evs)
	}
	// A group of the same name starts empty.
	e.mustGroup(t, "g")
	e.mustStream(t, "g", "s")
	if evs := e.srv.Events("g", "s"); len(evs) != 0 {
		t.Errorf("recreated stream has %d events", len(evs))
	}
}

func TestMissingResources(t *testing.T) {
	e := newEnv(t, Options{})
	ctx := context.Background()
	e.mustGroup(t, "g")
	_, err := e.put("nope", "s", ev(fixedNow, "x"))
	wantErr[*types.ResourceNotFoundException](t, err, "The specified log group does not exist.")
	_, err = e.put("g", "nope", ev(fixedNow, "x"))
	wantErr[*types.ResourceNotFoundException](t, err, "The specified log stream does not exist.")
	_, err = e.cl.GetLogEvents(ctx, &cwl.GetLogEventsInput{LogGroupName: aws.String("g"), LogStreamName: aws.String("nope")})
	wantErr[*types.ResourceNotFoundException](t, err, "log stream")
	_, err = e.cl.GetLogEvents(ctx, &cwl.GetLogEventsInput{LogGroupName: aws.String("nope"), LogStreamName: aws.String("s")})
	wantErr[*types.ResourceNotFoundException](t, err, "log group")
	_, err = e.cl.DescribeLogStreams(ctx, &cwl.DescribeLogStreamsInput{LogGroupName: aws.String("nope")})
	wantErr[*types.ResourceNotFoundException](t, err, "log group")
	_, err = e.cl.FilterLogEvents(ctx, &cwl.FilterLogEventsInput{LogGroupName: aws.String("nope")})
	wantErr[*types.ResourceNotFoundException](t, err, "log group")
	_, err = e.cl.DeleteRetentionPolicy(ctx, &cwl.DeleteRetentionPolicyInput{LogGroupName: aws.String("nope")})
	wantErr[*types.ResourceNotFoundException](t, err, "log group")
}
