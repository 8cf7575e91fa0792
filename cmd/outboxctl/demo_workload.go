package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/outboxkit/dispatcher/shared/outbox"
)

// The demo's workload: usage snapshots of a metered AI product, billed per
// tenant, the way a service would enqueue them in the transaction that
// records each turn.
const (
	// everyOrdered: one round of snapshots (one per tenant) in this many
	// carries the tenants' ordering keys (a per-tenant meter that must be
	// applied in order), so each key's sequence is short and every tenant
	// has one.
	everyOrdered = 50
	// everyRepeated: one snapshot in this many is enqueued a second time,
	// as a producer retrying after a timeout would.
	everyRepeated = 50
	// poisonCount snapshots carry a payload the plugin refuses.
	poisonCount = 5
	// awsMessages go to each AWS target when an emulator is configured.
	awsMessages = 500
)

type workload struct {
	messages []outbox.Message
	// repeats are enqueued after messages, with the same dedupe keys.
	repeats  []outbox.Message
	poison   int
	ordered  int
	toAWS    int
	expected map[string]bool // the keys the sink must handle: every http message but the poison
}

func buildWorkload(n, tenants int, withAWS bool, now time.Time) workload {
	w := workload{expected: make(map[string]bool, n)}
	ordered := func(i int) bool { return (i/tenants)%everyOrdered == 0 }
	poisonAt := map[int]bool{}
	for k := 1; k <= poisonCount; k++ {
		i := (n * k / (poisonCount + 1)) | 1 // odd: never a repeated one
		for ordered(i) && i+tenants < n {
			i += tenants // nor an ordered one
		}
		poisonAt[i] = true
	}
	models := []string{"m-small", "m-medium", "m-large"}
	for i := range n {
		tenant := fmt.Sprintf("tenant-%02d", i%tenants)
		key := fmt.Sprintf("%s/turn-%06d/usage", tenant, i)
		payload := map[string]any{
			"tenant_id":   tenant,
			"turn_id":     fmt.Sprintf("turn-%06d", i),
			"model":       models[i%len(models)],
			"tokens_in":   200 + (i*37)%4000,
			"tokens_out":  50 + (i*11)%1500,
			"recorded_at": now.Add(time.Duration(i) * time.Millisecond).UTC().Format(time.RFC3339Nano),
		}
		if poisonAt[i] {
			payload["poison"] = true
			w.poison++
		}
		body, _ := json.Marshal(payload) // maps of strings and ints: cannot fail
		m := outbox.Message{
			Namespace: "billing", Topic: "usage_snapshot", TenantID: tenant, DedupeKey: key, Payload: body,
			Headers: map[string]string{"schema": "usage_snapshot/v3"},
		}
		if ordered(i) {
			m.OrderingKey = "billing:" + tenant
			w.ordered++
		}
		if i%everyRepeated == 2 {
			w.repeats = append(w.repeats, m)
		}
		if !poisonAt[i] {
			w.expected[key] = true
		}
		w.messages = append(w.messages, m)
	}
	if withAWS {
		for i := range awsMessages {
			tenant := fmt.Sprintf("tenant-%02d", i%tenants)
			w.messages = append(w.messages,
				outbox.Message{Namespace: "payments", Topic: "payment_captured", TenantID: tenant,
					DedupeKey: fmt.Sprintf("%s/payment-%05d", tenant, i),
					Payload:   json.RawMessage(fmt.Sprintf(`{"tenant_id":%q,"amount_cents":%d,"currency":"EUR"}`, tenant, 100+i))},
				outbox.Message{Namespace: "audit", Topic: "api_key_rotated", TenantID: tenant,
					DedupeKey: fmt.Sprintf("%s/audit-%05d", tenant, i),
					Payload:   json.RawMessage(fmt.Sprintf(`{"tenant_id":%q,"actor":"user-%d"}`, tenant, i%17))})
			w.toAWS += 2
		}
	}
	return w
}
