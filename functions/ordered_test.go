package functions_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awssns "github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/dispatch"
	"github.com/outboxkit/dispatcher/shared/outbox"
	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/testkit/lambdatest"
	"github.com/outboxkit/dispatcher/shared/testkit/moto"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

func TestMain(m *testing.M) { moto.Main(m) }

func paymentsOf(key string) func(i int) outbox.Message {
	return func(i int) outbox.Message {
		return outbox.Message{Namespace: "payments", Topic: "captured", OrderingKey: key,
			DedupeKey: fmt.Sprintf("%s/pay-%d", key, i), Payload: json.RawMessage(fmt.Sprintf(`{"key":%q,"n":%d}`, key, i))}
	}
}

// 60 ordered messages over 3 keys, routed to an SNS FIFO topic (moto, with
// an SQS FIFO queue subscribed), are all delivered by one dispatch
// invocation, in order per key.
func TestOneInvocationDeliversOrderedKeysToSNSFIFO(t *testing.T) {
	t.Parallel()
	srv := moto.Start(t, "ordered delivery to an SNS FIFO topic")
	ctx := context.Background()
	cfg := srv.Config()
	snsClient, sqsClient := awssns.NewFromConfig(cfg), sqs.NewFromConfig(cfg)
	name := "payments-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	topic, err := snsClient.CreateTopic(ctx, &awssns.CreateTopicInput{Name: aws.String(name + ".fifo"),
		Attributes: map[string]string{"FifoTopic": "true"}})
	if err != nil {
		t.Fatal(err)
	}
	queue, err := sqsClient.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name + ".fifo"),
		Attributes: map[string]string{"FifoQueue": "true"}})
	if err != nil {
		t.Fatal(err)
	}
	qattrs, err := sqsClient.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: queue.QueueUrl,
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := snsClient.Subscribe(ctx, &awssns.SubscribeInput{TopicArn: topic.TopicArn, Protocol: aws.String("sqs"),
		Endpoint:   aws.String(qattrs.Attributes[string(sqstypes.QueueAttributeNameQueueArn)]),
		Attributes: map[string]string{"RawMessageDelivery": "true"}}); err != nil {
		t.Fatal(err)
	}

	db := pgtest.New(t)
	keys := []string{"acct-1", "acct-2", "acct-3"}
	// Interleaved, as payments arrive.
	enqueue(t, db.Pool, 60, func(i int) outbox.Message { return paymentsOf(keys[i%3])(i / 3) })
	routes := fmt.Sprintf(`{"routes":[{"match":{"namespace":"payments","topic":"*"},
		"target":{"type":"sns","topic_arn":%q,"timeout":"60s"}}]}`, aws.ToString(topic.TopicArn))
	fn := start(t, "dispatch", env(db, "OUTBOX_ROUTES="+routes, "AWS_ENDPOINT_URL="+srv.URL)...)

	var sum dispatch.Summary
	invoke(t, fn, event(t, "dispatch-schedule.json"), 50*time.Second, &sum)
	if sum.Delivered != 60 || sum.Dead != 0 || sum.Retried != 0 || sum.StoppedBy != "drained" {
		t.Fatalf("one invocation: %+v, want all 60 delivered and drained\n%s", sum, fn.Stderr())
	}

	// What the subscriber received, per key, in arrival order.
	got := map[string][]int{}
	deadline := time.Now().Add(30 * time.Second)
	for n := 0; n < 60 && time.Now().Before(deadline); {
		r, err := sqsClient.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: queue.QueueUrl, MaxNumberOfMessages: 10,
			WaitTimeSeconds: 1, MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameMessageGroupId}})
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range r.Messages {
			var body struct {
				Key string `json:"key"`
				N   int    `json:"n"`
			}
			if err := json.Unmarshal([]byte(aws.ToString(m.Body)), &body); err != nil {
				t.Fatal(err)
			}
			if group := m.Attributes[string(sqstypes.MessageSystemAttributeNameMessageGroupId)]; group != body.Key {
				t.Errorf("message %d of %s in group %q", body.N, body.Key, group)
			}
			got[body.Key] = append(got[body.Key], body.N)
			n++
			if _, err := sqsClient.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: queue.QueueUrl, ReceiptHandle: m.ReceiptHandle}); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, key := range keys {
		want := make([]int, 20)
		for i := range want {
			want[i] = i
		}
		if !slices.Equal(got[key], want) {
			t.Errorf("%s arrived as %v, want 0-19 in order", key, got[key])
		}
	}
}

// orderedReceiver is a webhook endpoint that records every request's key
// and sequence in arrival order and can refuse given sequences once, refuse
// some messages at once, or take its time over some messages.
type orderedReceiver struct {
	*httptest.Server
	mu       sync.Mutex
	arrivals []string // "key#sequence"
	failOnce map[string]bool
	refuse   func(env publish.Envelope) bool
	slow     func(env publish.Envelope) time.Duration
}

func newOrderedReceiver(t *testing.T) *orderedReceiver {
	r := &orderedReceiver{failOnce: map[string]bool{}}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		var env publish.Envelope
		if err := json.Unmarshal(body, &env); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		id := env.OrderingKey + "#" + strconv.FormatInt(env.SequenceID, 10)
		r.mu.Lock()
		r.arrivals = append(r.arrivals, id)
		fail := r.failOnce[id]
		delete(r.failOnce, id)
		refuse, slow := r.refuse, r.slow
		r.mu.Unlock()
		if refuse != nil && refuse(env) {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		if slow != nil {
			time.Sleep(slow(env))
		}
		if fail {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *orderedReceiver) routes(extra string) string {
	return fmt.Sprintf(`{"routes":[{"match":{"namespace":"*","topic":"*"},
		"target":{"type":"http","url":%q,"signing_secret_env":"SINK_SECRET","timeout":"10s","concurrency":8},
		"retry":{"max_attempts":5,"base_delay":"0s","max_delay":"1s"}%s}]}`, r.URL+"/hook", extra)
}

func (r *orderedReceiver) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.arrivals)
}

// A run that fails at its k-th message: the receiver sees 1..k-1, then k,
// then k again on retry, then the rest — never k+1 before k — and the
// messages released behind k are charged no attempt.
func TestRunFailingAtItsKthMessageKeepsTheKeysOrder(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rcv := newOrderedReceiver(t)
	const k = 6
	rcv.failOnce[fmt.Sprintf("acct-1#%d", k)] = true
	enqueue(t, db.Pool, 15, paymentsOf("acct-1"))
	fn := start(t, "dispatch", env(db, "OUTBOX_ROUTES="+rcv.routes(""))...)

	var sum dispatch.Summary
	for range 5 {
		invoke(t, fn, event(t, "dispatch-schedule.json"), 30*time.Second, &sum)
		if count(t, db.Pool, `SELECT count(*) FROM outbox.pending`) == 0 {
			break
		}
		// The failed message's retry comes due (a backoff of at most 1s).
		time.Sleep(1100 * time.Millisecond)
	}
	var want []string
	for i := 1; i <= 15; i++ {
		want = append(want, fmt.Sprintf("acct-1#%d", i))
		if i == k {
			want = append(want, fmt.Sprintf("acct-1#%d", i))
		}
	}
	if got := rcv.seen(); !slices.Equal(got, want) {
		t.Fatalf("the receiver saw\n%v\nwant\n%v", got, want)
	}
	// Every message after k was delivered on its first attempt: being
	// released behind k cost it nothing.
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE state = 'DISPATCHED' AND sequence_id > $1 AND attempt_no = 1`, k); n != 15-k {
		t.Errorf("%d messages after %d delivered on attempt 1, want %d", n, k, 15-k)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE sequence_id > $1 AND state <> 'DISPATCHED'`, k); n != 0 {
		t.Errorf("%d outcomes archived for messages released behind %d", n, k)
	}
}

// A row the dispatcher cannot decode (headers written before the database
// refused such values) is dead-lettered alone; the other nine of its batch
// are delivered by the same invocation.
func TestUndecodableMessageFailsAloneInItsBatch(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rcv := newOrderedReceiver(t)
	enqueue(t, db.Pool, 9, usage)
	if _, err := db.Pool.Exec(context.Background(), `INSERT INTO outbox.pending (id, namespace, topic, payload, payload_bytes, headers)
		VALUES (outbox.uuid_v7(), 'billing', 'usage_snapshot', '{"turn":99}', 11, '{"retries": 3}')`); err != nil {
		t.Fatal(err)
	}
	fn := start(t, "dispatch", env(db, "OUTBOX_ROUTES="+rcv.routes(""), "OUTBOX_BATCH_SIZE=10")...)
	var sum dispatch.Summary
	invoke(t, fn, event(t, "dispatch-schedule.json"), 30*time.Second, &sum)
	if sum.Delivered != 9 || sum.Dead != 1 || sum.StoppedBy != "drained" {
		t.Fatalf("%+v, want 9 delivered and the undecodable one dead\n%s", sum, fn.Stdout())
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.dead WHERE last_error_code = 'INVALID_MESSAGE' AND last_error LIKE '%headers%'`); n != 1 {
		t.Fatalf("%d dead as INVALID_MESSAGE naming the headers, want 1", n)
	}
}

// Payloads larger than any route may send are never loaded by the
// dispatcher: the function's memory stays flat while 160 MiB of them wait,
// and each is dead-lettered as PAYLOAD_TOO_LARGE without a call.
func TestHugePayloadsNeverReachTheFunctionsMemory(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	rcv := newOrderedReceiver(t)
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox.limits SET max_payload_bytes = 8388608`); err != nil {
		t.Fatal(err)
	}
	huge := json.RawMessage(`{"blob":"` + strings.Repeat("x", 8<<20-20) + `"}`)
	producer := outbox.Producer{Limits: outbox.Limits{MaxPayloadBytes: 8 << 20}}
	for i := range 20 {
		if _, err := producer.Enqueue(ctx, db.Pool, outbox.Message{Namespace: "billing", Topic: "usage", Payload: huge}); err != nil {
			t.Fatal(err)
		}
		if _, err := producer.Enqueue(ctx, db.Pool, usage(i)); err != nil {
			t.Fatal(err)
		}
	}
	fn := start(t, "dispatch", env(db, "OUTBOX_ROUTES="+rcv.routes(""))...)
	var sum dispatch.Summary
	invoke(t, fn, event(t, "dispatch-schedule.json"), 30*time.Second, &sum)
	if sum.Delivered != 20 || sum.Dead != 20 {
		t.Fatalf("%+v, want the 20 small ones delivered and the 20 huge ones dead", sum)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.dead WHERE last_error_code = 'PAYLOAD_TOO_LARGE' AND last_error LIKE '%never loaded%'`); n != 20 {
		t.Fatalf("%d huge payloads dead as PAYLOAD_TOO_LARGE without being loaded, want 20", n)
	}
	peak := peakRSS(t, fn.PID())
	if peak > 100<<20 {
		t.Fatalf("the dispatch function peaked at %d MiB of memory with 160 MiB of payloads it must never load", peak>>20)
	}
	t.Logf("peak RSS %d MiB beside 160 MiB of oversize payloads", peak>>20)
}

// Payloads a route may send, up to the claim's byte budget per batch
// (OUTBOX_BATCH_MAX_BYTES, 64 MiB by default, two batches in memory at
// once): the dispatch function delivers them all within the memory of the
// template's function, 256 MB. Without a soft memory limit the collector let
// the heap grow to twice what was live and the function peaked at 421 MiB,
// which Lambda ends as out of memory, every invocation, with the batch's
// leases left to expire.
func TestPayloadsNearTheRoutesLimitKeepTheFunctionWithinItsMemory(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	ctx := context.Background()
	rcv := newOrderedReceiver(t)
	if _, err := db.Pool.Exec(ctx, `UPDATE outbox.limits SET max_payload_bytes = 1048576`); err != nil {
		t.Fatal(err)
	}
	// 900 KiB each, under the webhook route's 1 MiB: 400 of them are 352 MiB.
	large := json.RawMessage(`{"blob":"` + strings.Repeat("x", 900<<10) + `"}`)
	producer := outbox.Producer{Limits: outbox.Limits{MaxPayloadBytes: 1 << 20}}
	const n = 400
	for range n {
		if _, err := producer.Enqueue(ctx, db.Pool, outbox.Message{Namespace: "billing", Topic: "usage", Payload: large}); err != nil {
			t.Fatal(err)
		}
	}
	fn := start(t, "dispatch", env(db, "OUTBOX_ROUTES="+rcv.routes(""))...)
	// As many invocations of the warm function as the machine needs: the
	// memory bound is the process's, whatever each invocation delivered
	// before its deadline.
	sum := drainByInvocations(t, db, fn, 60*time.Second)
	if sum.Delivered != n || sum.Dead != 0 {
		t.Fatalf("%+v, want all %d delivered", sum, n)
	}
	const functionMemory = 256 << 20 // lambdatest's AWS_LAMBDA_FUNCTION_MEMORY_SIZE, the template's MemorySize
	peak := peakRSS(t, fn.PID())
	if peak > functionMemory {
		t.Fatalf("the dispatch function peaked at %d MiB of memory delivering %d payloads of 900 KiB: over its %d MB",
			peak>>20, n, functionMemory>>20)
	}
	t.Logf("peak RSS %d MiB delivering %d payloads of 900 KiB in %d batches", peak>>20, n, sum.Batches)
}

// drainByInvocations invokes the warm dispatch function with the
// schedule's event until the queue is empty, as the schedule would when
// one invocation cannot take it all before its deadline (a slow or busy
// machine), and returns the invocations' summaries added up. It fails
// when an invocation delivers nothing although messages were due; when
// none is due (a retry's backoff), it waits for one to be.
func drainByInvocations(t *testing.T, db *pgtest.DB, fn *lambdatest.Function, budget time.Duration) dispatch.Summary {
	t.Helper()
	var total dispatch.Summary
	for invocations := 1; count(t, db.Pool, `SELECT count(*) FROM outbox.pending`) > 0; invocations++ {
		due := count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE available_at <= now()`)
		if due == 0 {
			waitForDue(t, db)
			continue
		}
		var sum dispatch.Summary
		invoke(t, fn, event(t, "dispatch-schedule.json"), budget, &sum)
		if sum.Delivered == 0 && sum.Dead == 0 {
			t.Fatalf("invocation %d settled nothing with %d messages due: %+v", invocations, due, sum)
		}
		t.Logf("invocation %d: %d delivered, %d retried, stopped by %s", invocations, sum.Delivered, sum.Retried, sum.StoppedBy)
		total.Claimed += sum.Claimed
		total.Delivered += sum.Delivered
		total.Retried += sum.Retried
		total.Dead += sum.Dead
		total.Batches += sum.Batches
	}
	return total
}

// waitForDue waits until a pending message is due, for as long as the
// latest retry's backoff may last.
func waitForDue(t *testing.T, db *pgtest.DB) {
	t.Helper()
	ceiling := time.Now().Add(10 * time.Minute)
	for count(t, db.Pool, `SELECT count(*) FROM outbox.pending WHERE available_at <= now()`) == 0 {
		if time.Now().After(ceiling) {
			t.Fatal("no pending message came due within 10 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// peakRSS is a process's high-water resident set (VmHWM), in bytes.
func peakRSS(t testing.TB, pid int) int64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc status")
	return 0
}

// Each message's attempt records the time of its own call: an immediate
// answer beside a slow one in the same batch is recorded as immediate.
func TestEachMessageRecordsItsOwnLatency(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rcv := newOrderedReceiver(t)
	rcv.slow = func(env publish.Envelope) time.Duration {
		if strings.Contains(string(env.Payload), `"slow":true`) {
			return 1500 * time.Millisecond
		}
		return 0
	}
	enqueue(t, db.Pool, 40, func(i int) outbox.Message {
		m := usage(i)
		if i%10 == 0 {
			m.Payload = json.RawMessage(fmt.Sprintf(`{"turn":%d,"slow":true}`, i))
		}
		return m
	})
	fn := start(t, "dispatch", env(db, "OUTBOX_ROUTES="+rcv.routes(""))...)
	var sum dispatch.Summary
	invoke(t, fn, event(t, "dispatch-schedule.json"), 30*time.Second, &sum)
	if sum.Delivered != 40 {
		t.Fatalf("%+v", sum)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE latency_ms >= 1500`); n != 4 {
		t.Errorf("%d attempts recorded at 1.5s or more, want the 4 slow ones", n)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE latency_ms < 500`); n != 36 {
		t.Errorf("%d attempts recorded under 500ms, want the 36 immediate ones", n)
	}
	// The metric carries the same figures (written before the run's last
	// log line).
	got := emfValues(t, awaitOutput(t, fn, `"dispatch finished"`, 1))
	if got["DispatchLatency/http"] < 4*1500 || got["DispatchLatency/http"] > 4*1500+36*500 {
		t.Errorf("DispatchLatency summed to %vms, not the messages' own latencies", got["DispatchLatency/http"])
	}
}

// The reproduction: an immediate 503 in a group that also held a
// slow call. The 503's attempt records its own instant, not the slow
// call's time, and the slow delivery its own 1.5 s.
func TestImmediateFailureBesideASlowCallRecordsItsOwnLatency(t *testing.T) {
	t.Parallel()
	db := pgtest.New(t)
	rcv := newOrderedReceiver(t)
	rcv.slow = func(env publish.Envelope) time.Duration {
		if strings.Contains(string(env.Payload), `"slow":true`) {
			return 1500 * time.Millisecond
		}
		return 0
	}
	rcv.refuse = func(env publish.Envelope) bool {
		return strings.Contains(string(env.Payload), `"refuse":true`) && env.Attempt == 1
	}
	enqueue(t, db.Pool, 10, func(i int) outbox.Message {
		m := usage(i)
		switch i {
		case 0:
			m.Payload = json.RawMessage(`{"turn":0,"slow":true}`)
		case 1:
			m.Payload = json.RawMessage(`{"turn":1,"refuse":true}`)
		}
		return m
	})
	// One claim takes all ten, so that the 503 and the slow call are in
	// one group, to one target, in one invocation.
	fn := start(t, "dispatch", env(db, "OUTBOX_ROUTES="+rcv.routes(""), "OUTBOX_BATCH_SIZE=10")...)
	var sum dispatch.Summary
	invoke(t, fn, event(t, "dispatch-schedule.json"), 30*time.Second, &sum)
	if sum.Retried < 1 {
		t.Fatalf("%+v, want the refused message retried", sum)
	}
	// Both in the first claim, recorded by the same invocation.
	latency := func(dedupeKey, state string) int {
		t.Helper()
		var ms int
		if err := db.Pool.QueryRow(context.Background(), `SELECT latency_ms FROM outbox.attempts
			WHERE dedupe_key = $1 AND state = $2 AND attempt_no = 1`, dedupeKey, state).Scan(&ms); err != nil {
			t.Fatalf("the %s attempt of %s: %v", state, dedupeKey, err)
		}
		return ms
	}
	if ms := latency(usage(1).DedupeKey, "RETRYABLE"); ms >= 500 {
		t.Errorf("the immediate 503 was recorded at %d ms: the slow call's time, not its own", ms)
	}
	if ms := latency(usage(0).DedupeKey, "DISPATCHED"); ms < 1500 {
		t.Errorf("the slow delivery was recorded at %d ms, want its 1.5 s", ms)
	}
	if n := count(t, db.Pool, `SELECT count(*) FROM outbox.attempts WHERE latency_ms >= 500 AND dedupe_key <> $1`, usage(0).DedupeKey); n != 0 {
		t.Errorf("%d attempts besides the slow one recorded at 500 ms or more", n)
	}
	if n := count(t, db.Pool, `SELECT count(DISTINCT worker_id) FROM outbox.attempts WHERE attempt_no = 1`); n != 1 {
		t.Errorf("first attempts recorded by %d workers, want the one invocation", n)
	}
}
