-- The lease fence, for a pending row p and a result r: p may be recorded by
-- worker p_worker_id under the token r.lease_token as of v_now. Either p
-- holds that lease itself, or p is a message of an ordered run whose head
-- holds it (a run's messages hold no lease of their own: see claim_batch),
-- found by one descent of pending_key_head. complete_batch says why this is
-- checked again after the statement.
(p.lease_token = r.lease_token AND p.claimed_by = p_worker_id AND p.lease_expires_at > v_now
 OR p.lease_token IS NULL
    AND EXISTS (SELECT 1 FROM outbox.pending h
                WHERE h.namespace = p.namespace AND h.ordering_key = p.ordering_key AND NOT h.behind
                  AND h.sequence_id < p.sequence_id AND h.run_through >= p.sequence_id
                  AND h.lease_token = r.lease_token AND h.claimed_by = p_worker_id
                  AND h.lease_expires_at > v_now))
