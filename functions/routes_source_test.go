package functions_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	ssmtypes "github.com/aws/aws-sdk-go-v2/service/ssm/types"
	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
	"github.com/outboxkit/dispatcher/shared/testkit/moto"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// largeRoutes are the sink's routes padded past Lambda's 4 KB environment
// limit with routes for other namespaces, as a real deployment's grow.
func largeRoutes(t *testing.T, s *webhookSink) string {
	t.Helper()
	base := s.routes()
	var extra strings.Builder
	for i := 0; extra.Len() < 5000; i++ {
		extra.WriteString(`,{"match":{"namespace":"tenant-` + strings.Repeat("x", 20) + string(rune('a'+i%26)) + "-" + uuid.NewString()[:8] + `","topic":"*"},"target":{"type":"sns","topic_arn":"arn:aws:sns:us-east-1:123456789012:other"}}`)
	}
	routes := strings.Replace(base, `}]}`, `}`+extra.String()+`]}`, 1)
	if len(routes) <= 4096 {
		t.Fatalf("the routes are %d bytes: the test needs more than Lambda's 4 KB environment", len(routes))
	}
	return routes
}

// The dispatch function reads routes too large for its environment from a
// file shipped beside bootstrap (OUTBOX_ROUTES_FILE) or from an SSM
// parameter (OUTBOX_ROUTES_SSM_PARAMETER, against moto_server), and
// delivers by them.
func TestDispatchReadsRoutesBeyondTheEnvironmentLimit(t *testing.T) {
	t.Parallel()
	srv := moto.Start(t, "routes read from SSM Parameter Store by the dispatch bootstrap")
	s := newSink(t)
	routes := largeRoutes(t, s)

	file := filepath.Join(t.TempDir(), "routes.json")
	if err := os.WriteFile(file, []byte(routes), 0o600); err != nil {
		t.Fatal(err)
	}
	parameter := "/outbox-test/" + uuid.NewString()[:8] + "/routes"
	client := ssm.NewFromConfig(srv.Config())
	if _, err := client.PutParameter(context.Background(), &ssm.PutParameterInput{Name: aws.String(parameter), Value: aws.String(routes),
		Type: ssmtypes.ParameterTypeSecureString, Tier: ssmtypes.ParameterTierAdvanced}); err != nil {
		t.Fatal(err)
	}

	for _, source := range []struct{ name, setting string }{
		{"OUTBOX_ROUTES_FILE", "OUTBOX_ROUTES_FILE=" + file},
		{"OUTBOX_ROUTES_SSM_PARAMETER", "OUTBOX_ROUTES_SSM_PARAMETER=" + parameter},
	} {
		t.Run(source.name, func(t *testing.T) {
			db := pgtest.New(t)
			enqueue(t, db.Pool, 20, usage)
			fn := start(t, "dispatch", env(db, source.setting, "AWS_ENDPOINT_URL="+srv.URL)...)
			var sum dispatch.Summary
			invoke(t, fn, event(t, "dispatch-schedule.json"), 30*time.Second, &sum)
			if sum.Delivered != 20 || sum.Dead != 0 {
				t.Errorf("routes from %s: %+v, want 20 delivered", source.name, sum)
			}
		})
	}

	// A parameter that does not exist fails the cold start, naming it.
	db := pgtest.New(t)
	fn := start(t, "dispatch", env(db, "OUTBOX_ROUTES_SSM_PARAMETER=/outbox-test/no-such-parameter", "AWS_ENDPOINT_URL="+srv.URL)...)
	_, err := fn.ColdStart(30 * time.Second)
	fe, ok := err.(*lambdatest.FunctionError)
	want := `route: OUTBOX_ROUTES_SSM_PARAMETER: reading "/outbox-test/no-such-parameter": no such parameter`
	if !ok || !fe.Init || !strings.Contains(fe.Message, want) {
		t.Errorf("cold start with a missing parameter: %v, want an init error saying %q", err, want)
	}
}
