package moto_test

import (
	"context"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"

	"github.com/outboxkit/dispatcher/shared/testkit/moto"
)

func TestMain(m *testing.M) { moto.Main(m) }

func TestServerAnswersRealSDKCalls(t *testing.T) {
	srv := moto.Start(t, "the moto harness")
	client := sns.NewFromConfig(srv.Config())
	out, err := client.CreateTopic(context.Background(), &sns.CreateTopicInput{Name: aws.String("harness-check")})
	if err != nil {
		t.Fatal(err)
	}
	if aws.ToString(out.TopicArn) != "arn:aws:sns:"+moto.Region+":"+moto.AccountID+":harness-check" {
		t.Fatalf("topic ARN %s", aws.ToString(out.TopicArn))
	}
}
