CREATE OR REPLACE FUNCTION outbox.gate_targets(
    p_worker_id    text,
    p_targets      text[],
    p_wanted       int[],
    p_cool_down_ms int[],
    p_per_second   int[])
RETURNS TABLE(target text, granted int, state text, retry_at timestamptz, last_error text, failures int)
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
-- One call per claimed batch that has messages for a target with a circuit
-- breaker or a rate limit: element i of each array describes target i, how
-- many messages the batch would send it, its breaker's cool-down (NULL: no
-- breaker) and its rate (NULL: no limit). Answers per target how many of
-- them may be sent now (granted) and, for the rest, when to offer them
-- again (retry_at):
--
--   closed  granted = wanted (or what the bucket grants)
--   open    granted = 0 until retry_at, the next probe
--   probe   granted = 1: this caller won the probe due now; the next probe
--           moves one cool-down on, so a caller that dies mid-probe does
--           not keep the breaker shut for longer than that
--
-- failures is the closed breaker's count of consecutive failures so far:
-- a caller records a batch's successes only when it is not 0.
--
-- Rate: a token bucket holding at most one second's tokens, refilled at
-- p_per_second a second; the grant is what it holds, whole, up to wanted.
-- retry_at is then the first of the slots the held messages reserve: when
-- the bucket will hold its next token, or after the slots reserved by
-- earlier callers' held messages, one slot per message at the rate (the
-- caller spreads its held messages over them). So a backlog waiting on
-- the limit comes back about when it can be sent, not all at once.
--
-- Rows are locked in target order, so concurrent callers never deadlock;
-- a probe is won by the conditional update on probe_at, which a second
-- caller re-checks after the first commits, and loses.
DECLARE
    v_now    timestamptz := clock_timestamp();
    v_i      int;
    v_t      text;
    v_want   int;
    v_grant  int;
    v_state  text;
    v_retry  timestamptz;
    v_error  text;
    v_b      outbox.breakers;
    v_tokens double precision;
BEGIN
    IF p_worker_id IS NULL OR p_worker_id = '' THEN
        RAISE EXCEPTION 'outbox.gate_targets: p_worker_id must not be empty' USING ERRCODE = '22023';
    END IF;
    IF cardinality(p_targets) IS DISTINCT FROM cardinality(p_wanted)
       OR cardinality(p_targets) IS DISTINCT FROM cardinality(p_cool_down_ms)
       OR cardinality(p_targets) IS DISTINCT FROM cardinality(p_per_second) THEN
        RAISE EXCEPTION 'outbox.gate_targets: p_targets, p_wanted, p_cool_down_ms and p_per_second must have one element per target'
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_targets, p_wanted, p_cool_down_ms, p_per_second) AS x(t, w, c, r)
               WHERE x.t IS NULL OR x.t = '' OR x.w IS NULL OR x.w < 0 OR x.c < 1000 OR x.r < 1) THEN
        RAISE EXCEPTION 'outbox.gate_targets: each target needs a name, wanted >= 0, a cool-down of at least 1000 ms or NULL, a rate of at least 1 or NULL'
            USING ERRCODE = '22023';
    END IF;
    FOR v_i IN SELECT o.i FROM generate_subscripts(p_targets, 1) AS o(i) ORDER BY p_targets[o.i] LOOP
        v_t := p_targets[v_i];
        v_want := p_wanted[v_i];
        v_grant := v_want;
        v_state := 'closed';
        v_retry := NULL;
        v_error := NULL;
        v_b := NULL;
        IF p_cool_down_ms[v_i] IS NOT NULL THEN
            SELECT * INTO v_b FROM outbox.breakers b WHERE b.target = v_t;
            IF v_b.opened_at IS NOT NULL THEN
                v_error := v_b.last_error;
                UPDATE outbox.breakers b
                SET probe_at = v_now + make_interval(secs => p_cool_down_ms[v_i] / 1000.0),
                    probe_by = p_worker_id, updated_at = v_now
                WHERE b.target = v_t AND b.opened_at IS NOT NULL AND b.probe_at <= v_now
                RETURNING b.probe_at INTO v_retry;
                IF FOUND THEN
                    v_state := 'probe';
                    v_grant := least(v_want, 1);
                ELSE
                    SELECT b.probe_at INTO v_retry FROM outbox.breakers b WHERE b.target = v_t;
                    v_state := CASE WHEN v_retry IS NULL THEN 'closed' ELSE 'open' END;
                    v_grant := CASE WHEN v_retry IS NULL THEN v_want ELSE 0 END;
                END IF;
            END IF;
        END IF;
        IF p_per_second[v_i] IS NOT NULL AND v_grant > 0 THEN
            INSERT INTO outbox.rate_limits AS l (target, tokens, refilled_at)
            VALUES (v_t, p_per_second[v_i], v_now)
            ON CONFLICT ON CONSTRAINT rate_limits_pkey DO UPDATE
            SET tokens = least(p_per_second[v_i]::double precision,
                               l.tokens + greatest(extract(epoch FROM v_now - l.refilled_at), 0) * p_per_second[v_i]),
                refilled_at = greatest(l.refilled_at, v_now)
            RETURNING l.tokens INTO v_tokens;
            v_grant := least(v_grant, floor(v_tokens)::int);
            -- The messages held back reserve the next free slots: from
            -- when the bucket holds its next token, or after the slots
            -- earlier callers reserved, one per message at the rate.
            UPDATE outbox.rate_limits l
            SET tokens = greatest(l.tokens - v_grant, 0),
                held_until = CASE WHEN v_grant < v_want AND v_state <> 'probe'
                                  THEN greatest(l.held_until,
                                                v_now + make_interval(secs => (1 - (v_tokens - v_grant)) / p_per_second[v_i]))
                                       + make_interval(secs => (v_want - v_grant)::double precision / p_per_second[v_i])
                                  ELSE l.held_until END
            WHERE l.target = v_t
            RETURNING CASE WHEN v_grant < v_want AND v_state <> 'probe'
                           THEN l.held_until - make_interval(secs => (v_want - v_grant)::double precision / p_per_second[v_i])
                      END
            INTO v_retry;
        END IF;
        target := v_t;
        granted := v_grant;
        state := v_state;
        retry_at := v_retry;
        last_error := v_error;
        failures := coalesce(v_b.failures, 0);
        RETURN NEXT;
    END LOOP;
END;
$$;
REVOKE ALL ON FUNCTION outbox.gate_targets(text, text[], int[], int[], int[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION outbox.gate_targets(text, text[], int[], int[], int[]) TO outbox_dispatcher;
