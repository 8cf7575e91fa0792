package ssmparam_test

import (
	"context"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"
	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/config/ssmparam"
	"github.com/outboxkit/dispatcher/shared/testkit/moto"
)

func TestMain(m *testing.M) { moto.Main(m) }

// The reader gets a parameter's value through the real SSM client,
// decrypting a SecureString, and a routes document beyond the 4 KB of
// Lambda's environment (an advanced parameter holds 8 KB).
func TestReaderReadsParameters(t *testing.T) {
	t.Parallel()
	srv := moto.Start(t, "reading the routes from SSM Parameter Store")
	ctx := context.Background()
	client := ssm.NewFromConfig(srv.Config())
	prefix := "/outbox-test/" + uuid.NewString()[:8]
	large := `{"routes":[` + strings.Repeat(`{"match":{"namespace":"n","topic":"t"},"target":{"type":"sns","topic_arn":"arn:aws:sns:us-east-1:123456789012:t"}},`, 50) + `]}`
	params := []struct {
		name, value string
		typ         ssmtypes.ParameterType
		tier        ssmtypes.ParameterTier
	}{
		{prefix + "/plain", `{"routes":[]}`, ssmtypes.ParameterTypeString, ssmtypes.ParameterTierStandard},
		{prefix + "/secure", "routes:\n  - match: {namespace: a, topic: b}\n", ssmtypes.ParameterTypeSecureString, ssmtypes.ParameterTierStandard},
		{prefix + "/large", large, ssmtypes.ParameterTypeString, ssmtypes.ParameterTierAdvanced},
	}
	if len(large) <= 4096 {
		t.Fatalf("the large routes are %d bytes: the test needs more than 4 KB", len(large))
	}
	for _, p := range params {
		if _, err := client.PutParameter(ctx, &ssm.PutParameterInput{Name: aws.String(p.name), Value: aws.String(p.value), Type: p.typ, Tier: p.tier}); err != nil {
			t.Fatalf("put %s: %v", p.name, err)
		}
	}

	loads := 0
	read := ssmparam.Reader(ctx, func(context.Context) (aws.Config, error) { loads++; return srv.Config(), nil })
	for _, p := range params {
		got, err := read(p.name)
		if err != nil || got != p.value {
			t.Errorf("read %s = %.60q, %v; want %.60q", p.name, got, err, p.value)
		}
	}
	if loads != 1 {
		t.Errorf("the AWS configuration was loaded %d times for three reads, want once", loads)
	}
	if _, err := read(prefix + "/missing"); err == nil || !strings.Contains(err.Error(), "no such parameter") {
		t.Errorf("read a missing parameter: %v, want one saying there is no such parameter", err)
	}
}
