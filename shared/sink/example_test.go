package sink_test

import (
	"context"
	"encoding/json"
	"errors"
	"log"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/outboxkit/dispatcher/shared/publish"
	"github.com/outboxkit/dispatcher/shared/publish/webhook"
	"github.com/outboxkit/dispatcher/shared/sink"
)

// A billing receiver that is exactly once in effect: the usage row and the
// webhook-id commit in one transaction.
func ExampleNewPostgresDeduper() {
	ctx := context.Background()
	secret, err := webhook.ParseSecret(os.Getenv("BILLING_WEBHOOK_SECRET")) // "whsec_…"
	if err != nil {
		log.Fatal(err)
	}
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	dedupe, err := sink.NewPostgresDeduper(ctx, pool, "billing.webhook_dedupe")
	if err != nil {
		log.Fatal(err)
	}

	recordUsage := func(ctx context.Context, env publish.Envelope) error {
		var usage struct {
			Customer string `json:"customer"`
			Units    int64  `json:"units"`
		}
		if err := json.Unmarshal(env.Payload, &usage); err != nil || usage.Customer == "" {
			// Retrying will not fix the payload: refuse it for good.
			return sink.Reject(http.StatusUnprocessableEntity, errors.New("usage payload without a customer"))
		}
		tx, _ := sink.Tx(ctx) // the transaction the webhook-id is recorded in
		_, err := tx.Exec(ctx, `INSERT INTO billing.usage (customer, units, outbox_key) VALUES ($1, $2, $3)`,
			usage.Customer, usage.Units, env.Key)
		return err // an error rolls back both: the dispatcher retries
	}

	http.Handle("POST /hooks/usage", sink.NewReceiver(secret, dedupe, recordUsage))
	go func() {
		// Forget ids once the dispatcher can no longer resend them.
		for range time.Tick(time.Hour) {
			_, _ = dedupe.Purge(ctx, 30*24*time.Hour)
		}
	}()
	log.Fatal(http.ListenAndServe(":8080", nil))
}
