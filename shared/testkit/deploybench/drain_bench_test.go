package deploybench_test

import (
	"flag"
	"testing"

	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/snsfake"
	"github.com/outboxkit/dispatcher/shared/testkit/deploybench"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdaemu"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// dispatchBinary lets a profile run an unstripped bootstrap (go build
// -tags lambda.norpc ./functions/dispatch) under perf record, whose
// symbols the deployment's stripped build lacks.
var dispatchBinary = flag.String("dispatch-binary", "", "the dispatch bootstrap to run (default: built as deployed)")

// BenchmarkInvocationDrain is one dispatch invocation at the template's
// memory's CPU share draining 30,000 messages to each target, all
// answering at once: the bootstrap's CPU per message by path, and the rate
// the share allows.
//
//	go test -run '^$' -bench InvocationDrain -benchtime 1x ./shared/testkit/deploybench
//	perf record -g -o /tmp/drain.perf -- go test -run '^$' -bench 'InvocationDrain/webhook' -benchtime 1x ./shared/testkit/deploybench -args -dispatch-binary /tmp/bootstrap
func BenchmarkInvocationDrain(b *testing.B) {
	const backlog = 30000
	binary := *dispatchBinary
	if binary == "" {
		binary = lambdatest.Build(b, "dispatch")
	}
	for _, target := range []string{deploybench.TargetEventBridge, "sns", deploybench.TargetWebhook} {
		b.Run(target, func(b *testing.B) {
			var cpuPerMessage, rate float64
			for range b.N {
				db := pgtest.New(b)
				cfg := deploybench.DrainConfig{
					DatabaseURL: db.URL, DispatchBinary: binary, Backlog: backlog, Target: target,
					CPU: lambdaemu.CPUShare{Mode: lambdaemu.CPULambdaShare},
				}
				if target == "sns" {
					sns := snsfake.New(b)
					cfg.Target = ""
					cfg.Custom = &deploybench.CustomTarget{
						Name: "sns (snsfake)",
						Env: []string{
							`OUTBOX_ROUTES={"routes":[{"match":{"namespace":"*","topic":"*"},"target":{"type":"sns","topic_arn":"` + snsfake.TopicARN("bench") + `"}}]}`,
							"AWS_ENDPOINT_URL_SNS=" + sns.URL(),
						},
						Received: func() int { return len(sns.Received()) },
					}
				}
				res, err := deploybench.InvocationDrain(b.Context(), cfg)
				if err != nil {
					b.Fatal(err)
				}
				b.Log(res)
				cpuPerMessage += float64(res.CPUPerMessage().Nanoseconds()) / 1e3
				rate += res.Rate()
			}
			b.ReportMetric(cpuPerMessage/float64(b.N), "cpu-µs/msg")
			b.ReportMetric(rate/float64(b.N), "msgs/s")
		})
	}
}
