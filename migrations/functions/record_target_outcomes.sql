CREATE OR REPLACE FUNCTION outbox.record_target_outcomes(
    p_worker_id    text,
    p_targets      text[],
    p_succeeded    boolean[],
    p_failures     int[],
    p_threshold    int[],
    p_cool_down_ms int[],
    p_last_error   text[])
RETURNS TABLE(target text, state text, probe_at timestamptz)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
-- Records what one batch's calls to targets with a circuit breaker did:
-- element i of each array describes target i: whether any call succeeded,
-- the retryable failures after the last success (all of them when none
-- did), the breaker's threshold and cool-down, and the last error. The
-- dispatcher calls it only when a call failed or the breaker was not
-- closed and clean (outbox.gate_targets said so), so a healthy target
-- costs nothing here.
--
--   a success with no failure after it closes the breaker (a probe that
--   succeeded) and clears the count;
--   failures add to the count (after a success, they are the count); at
--   the threshold a closed breaker opens, its probe due one cool-down on;
--   a failure of the probe this worker won re-opens it for a cool-down.
--
-- Answers each target's state after: closed or open, with its next probe.
DECLARE
    v_now timestamptz := clock_timestamp();
    v_i   int;
BEGIN
    IF p_worker_id IS NULL OR p_worker_id = '' THEN
        RAISE EXCEPTION 'outbox.record_target_outcomes: p_worker_id must not be empty' USING ERRCODE = '22023';
    END IF;
    IF cardinality(p_targets) IS DISTINCT FROM cardinality(p_succeeded)
       OR cardinality(p_targets) IS DISTINCT FROM cardinality(p_failures)
       OR cardinality(p_targets) IS DISTINCT FROM cardinality(p_threshold)
       OR cardinality(p_targets) IS DISTINCT FROM cardinality(p_cool_down_ms)
       OR cardinality(p_targets) IS DISTINCT FROM cardinality(p_last_error) THEN
        RAISE EXCEPTION 'outbox.record_target_outcomes: every array must have one element per target' USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_targets, p_succeeded, p_failures, p_threshold, p_cool_down_ms)
                             AS x(t, s, f, n, c)
               WHERE x.t IS NULL OR x.t = '' OR x.s IS NULL OR x.f IS NULL OR x.f < 0
                  OR x.n IS NULL OR x.n < 1 OR x.c IS NULL OR x.c < 1000) THEN
        RAISE EXCEPTION 'outbox.record_target_outcomes: each target needs a name, succeeded, failures >= 0, a threshold >= 1 and a cool-down of at least 1000 ms'
            USING ERRCODE = '22023';
    END IF;
    FOR v_i IN SELECT o.i FROM generate_subscripts(p_targets, 1) AS o(i) ORDER BY p_targets[o.i] LOOP
        INSERT INTO outbox.breakers AS b (target, failures, updated_at)
        VALUES (p_targets[v_i], 0, v_now)
        ON CONFLICT ON CONSTRAINT breakers_pkey DO NOTHING;
        RETURN QUERY
        UPDATE outbox.breakers b
        SET failures = x.failures,
            opened_at = CASE WHEN x.closes THEN NULL
                             WHEN b.opened_at IS NULL AND x.failures >= p_threshold[v_i] THEN v_now
                             ELSE b.opened_at END,
            probe_at = CASE WHEN x.closes THEN NULL
                            WHEN b.opened_at IS NULL AND x.failures >= p_threshold[v_i]
                                 OR b.opened_at IS NOT NULL AND b.probe_by = p_worker_id AND p_failures[v_i] > 0
                                THEN v_now + make_interval(secs => p_cool_down_ms[v_i] / 1000.0)
                            ELSE b.probe_at END,
            probe_by = CASE WHEN x.closes OR b.probe_by = p_worker_id THEN NULL ELSE b.probe_by END,
            last_error = CASE WHEN p_failures[v_i] > 0 THEN left(p_last_error[v_i], 1024) ELSE b.last_error END,
            updated_at = v_now
        FROM (SELECT CASE WHEN p_succeeded[v_i] THEN p_failures[v_i] ELSE b0.failures + p_failures[v_i] END AS failures,
                     p_succeeded[v_i] AND p_failures[v_i] = 0 AS closes
              FROM outbox.breakers b0 WHERE b0.target = p_targets[v_i]) x
        WHERE b.target = p_targets[v_i]
        RETURNING b.target, CASE WHEN b.opened_at IS NULL THEN 'closed' ELSE 'open' END, b.probe_at;
    END LOOP;
END;
$$;
REVOKE ALL ON FUNCTION outbox.record_target_outcomes(text, text[], boolean[], int[], int[], int[], text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.record_target_outcomes(text, text[], boolean[], int[], int[], int[], text[]) TO outbox_dispatcher;
