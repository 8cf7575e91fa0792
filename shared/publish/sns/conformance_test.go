package sns_test

import (
	"testing"

	"github.com/google/uuid"

	"github.com/outboxkit/dispatcher/shared/publish/sns"
	"github.com/outboxkit/dispatcher/shared/testkit/awsfake/snsfake"
	"github.com/outboxkit/dispatcher/shared/testkit/publishtest"
)

func TestConformance(t *testing.T) {
	for _, topic := range []string{standardTopic, fifoTopic} {
		t.Run(topic, func(t *testing.T) {
			publishtest.Run(t, func(t *testing.T) *publishtest.Target {
				b := setup(t, setupOptions{cfg: sns.Config{TopicARN: snsfake.TopicARN(topic)}})
				// The cap covers the body and the attributes, which are the
				// same size for every message the suite builds.
				sample := publishtest.Message(0, 0)
				attributeBytes := snsSize(sample) - len(sample.Payload)
				return &publishtest.Target{
					Publisher:       b.pub,
					MaxPayloadBytes: sns.DefaultMaxMessageBytes - attributeBytes,
					Received:        b.fake.ReceivedIDs,
					Calls:           b.fake.CallIDs,
					Requests:        b.fake.Requests,
					Fail: func(id uuid.UUID, terminal bool) {
						if terminal {
							b.fake.FailMessage(snsfake.ID(id), "InvalidParameter", true)
						} else {
							b.fake.FailMessage(snsfake.ID(id), "InternalError", false)
						}
					},
					Stall: b.fake.Stall,
				}
			})
		})
	}
}
