package functions_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/outboxkit/dispatcher/shared/handler/migratefn"
	"github.com/outboxkit/dispatcher/shared/testkit/pgtest"
)

// cfnEndpoint stands in for the pre-signed S3 URL CloudFormation gives a
// custom resource: it records every answer PUT to it.
type cfnEndpoint struct {
	*httptest.Server
	mu      sync.Mutex
	answers []cfnAnswer
}

type cfnAnswer struct {
	Status             string         `json:"Status"`
	Reason             string         `json:"Reason"`
	RequestID          string         `json:"RequestId"`
	LogicalResourceID  string         `json:"LogicalResourceId"`
	StackID            string         `json:"StackId"`
	PhysicalResourceID string         `json:"PhysicalResourceId"`
	Data               map[string]any `json:"Data"`
	contentType        string
}

func newCfnEndpoint(t *testing.T) *cfnEndpoint {
	t.Helper()
	e := &cfnEndpoint{}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var a cfnAnswer
		if r.Method != http.MethodPut || json.Unmarshal(body, &a) != nil {
			http.Error(w, "want a PUT of a JSON answer", http.StatusBadRequest)
			return
		}
		a.contentType = r.Header.Get("Content-Type")
		e.mu.Lock()
		e.answers = append(e.answers, a)
		e.mu.Unlock()
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *cfnEndpoint) last(t *testing.T) cfnAnswer {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.answers) == 0 {
		t.Fatal("no answer was sent to the ResponseURL")
	}
	return e.answers[len(e.answers)-1]
}

// cfnRequest is a custom resource request as CloudFormation sends it.
func cfnRequest(e *cfnEndpoint, requestType, requestID, physicalID string) []byte {
	req := map[string]any{
		"RequestType": requestType, "RequestId": requestID, "ResponseURL": e.URL + "/presigned?X-Amz-Signature=abc",
		"ResourceType": "Custom::OutboxSchema", "LogicalResourceId": "OutboxSchema",
		"StackId":            "arn:aws:cloudformation:us-east-1:123456789012:stack/outbox/1",
		"ResourceProperties": map[string]any{"ServiceToken": "arn:aws:lambda:us-east-1:123456789012:function:migrate", "MigrateFunctionVersion": "3"},
	}
	if physicalID != "" {
		req["PhysicalResourceId"] = physicalID
	}
	b, _ := json.Marshal(req)
	return b
}

// The migrate bootstrap applies the migrations when CloudFormation creates
// or updates its custom resource, answers at the ResponseURL, leaves the
// schema alone on Delete, and runs by hand too.
func TestMigrateFunctionAppliesTheSchemaOnDeploy(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewEmpty(t)
	endpoint := newCfnEndpoint(t)
	fn := start(t, "migrate", "OUTBOX_DATABASE_URL="+dbURL, "OUTBOX_TRACING=off")
	ctx := context.Background()
	schemaExists := func() bool {
		t.Helper()
		conn := pgtest.Connect(t, dbURL)
		defer conn.Close(ctx)
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_namespace WHERE nspname = 'outbox'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}

	var answer map[string]string
	invoke(t, fn, cfnRequest(endpoint, "Create", "req-create", ""), 60*time.Second, &answer)
	created := endpoint.last(t)
	if created.Status != "SUCCESS" || created.PhysicalResourceID != migratefn.PhysicalResourceID || created.RequestID != "req-create" ||
		created.LogicalResourceID != "OutboxSchema" || created.StackID == "" || answer["status"] != "SUCCESS" {
		t.Fatalf("Create: answered %+v (invocation %v)", created, answer)
	}
	if created.Data["Applied"] == float64(0) || created.Data["Version"] != created.Data["Latest"] {
		t.Errorf("Create: Data %v, want every migration applied", created.Data)
	}
	if created.contentType != "" {
		t.Errorf("the answer was sent with Content-Type %q: a pre-signed URL signed without one refuses it", created.contentType)
	}
	if !schemaExists() {
		t.Fatal("Create answered SUCCESS but schema outbox does not exist")
	}

	// By hand: nothing left to apply.
	var manual migratefn.Answer
	invoke(t, fn, []byte(`{}`), 30*time.Second, &manual)
	if manual.Action != "up" || len(manual.Applied) != 0 || manual.Pending != 0 || manual.Version != manual.Latest {
		t.Errorf("manual up after Create: %+v", manual)
	}
	// One function as an older release left it: Update applies its file.
	conn := pgtest.Connect(t, dbURL)
	if _, err := conn.Exec(ctx, `UPDATE outbox.function_sources SET sha256 = 'older' WHERE file = 'functions/stats.sql'`); err != nil {
		t.Fatal(err)
	}
	invoke(t, fn, []byte(`{"action":"status"}`), 30*time.Second, &manual)
	if manual.Action != "status" || manual.Pending != 1 {
		t.Errorf("status with one function file changed: %+v, want 1 pending", manual)
	}

	invoke(t, fn, cfnRequest(endpoint, "Update", "req-update", migratefn.PhysicalResourceID), 60*time.Second, &answer)
	if updated := endpoint.last(t); updated.Status != "SUCCESS" || updated.PhysicalResourceID != migratefn.PhysicalResourceID || updated.Data["Applied"] != float64(1) {
		t.Errorf("Update: answered %+v, want SUCCESS with one migration applied", updated)
	}

	invoke(t, fn, cfnRequest(endpoint, "Delete", "req-delete", migratefn.PhysicalResourceID), 30*time.Second, &answer)
	if deleted := endpoint.last(t); deleted.Status != "SUCCESS" || deleted.PhysicalResourceID != migratefn.PhysicalResourceID {
		t.Errorf("Delete: answered %+v", deleted)
	}
	if !schemaExists() {
		t.Error("Delete dropped schema outbox: deleting the stack must never drop the messages")
	}

	resp, err := fn.Invoke(ctx, []byte(`{"action":"down"}`), 10*time.Second)
	if err != nil || resp.Err == nil || !strings.Contains(resp.Err.Message, "action must be up or status") {
		t.Errorf(`{"action":"down"}: %v %+v, want it refused`, err, resp.Err)
	}
}

// A configuration the function cannot use, or a database it cannot reach,
// fails the request with the reason — never leaves CloudFormation waiting —
// and Delete still succeeds, so that a broken stack can be deleted.
func TestMigrateFunctionAnswersCloudFormationWhateverFails(t *testing.T) {
	t.Parallel()
	endpoint := newCfnEndpoint(t)
	for _, tc := range []struct {
		name string
		env  []string
		want string
	}{
		{"no database", []string{"OUTBOX_TRACING=off"}, "no database configured"},
		{"unreachable database", []string{"OUTBOX_DATABASE_URL=postgres://owner:hunter2@127.0.0.1:1/app?connect_timeout=2", "OUTBOX_TRACING=off"}, "127.0.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fn := start(t, "migrate", tc.env...)
			var answer map[string]string
			id := "req-create-" + strings.ReplaceAll(tc.name, " ", "-")
			invoke(t, fn, cfnRequest(endpoint, "Create", id, ""), 30*time.Second, &answer)
			var got cfnAnswer
			endpoint.mu.Lock()
			for _, a := range endpoint.answers {
				if a.RequestID == id {
					got = a
				}
			}
			endpoint.mu.Unlock()
			if got.Status != "FAILED" || !strings.Contains(got.Reason, tc.want) || strings.Contains(got.Reason, "hunter2") {
				t.Errorf("Create: answered %+v, want FAILED naming %q (and no password)", got, tc.want)
			}
			invoke(t, fn, cfnRequest(endpoint, "Delete", id+"-delete", migratefn.PhysicalResourceID), 30*time.Second, &answer)
			if answer["status"] != "SUCCESS" {
				t.Errorf("Delete with %s: %v, want SUCCESS: a stack that never migrated must still delete", tc.name, answer)
			}
		})
	}
}
