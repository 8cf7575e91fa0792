-- trace_context_problem is the W3C Trace Context rule for a producer's
-- headers traceparent and tracestate (https://www.w3.org/TR/trace-context/),
-- the Go producer's headers.TraceContextProblem: what is wrong with the
-- header p_name = p_value, NULL when nothing is or the header is another.
-- p_has_traceparent says whether the message also carries a traceparent.
-- The names are taken in lowercase only (two spellings of one name would go
-- out as one HTTP header with two values), the traceparent in version 00
-- only, with no flags but sampled and random (what every reader parses
-- alike: OpenTelemetry drops a context with other flags set). The patterns have no bounded
-- repetitions, which PostgreSQL's regular expressions run far slower: the
-- lengths are checked apart.
CREATE OR REPLACE FUNCTION outbox.trace_context_problem(p_name text, p_value text, p_has_traceparent boolean)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_member  text;
    v_key     text;
    v_value   text;
    v_keys    text[] := '{}';
BEGIN
    IF lower(p_name) NOT IN ('traceparent', 'tracestate') THEN
        RETURN NULL;
    END IF;
    IF p_name <> lower(p_name) THEN
        RETURN format('name "%s" must be written "%s", in lowercase', p_name, lower(p_name));
    END IF;
    IF p_name = 'traceparent' THEN
        IF octet_length(p_value) <> 55 OR p_value !~ '^00-[0-9a-f]+-[0-9a-f]+-0[0-3]$'
           OR substr(p_value, 36, 1) <> '-' OR substr(p_value, 53, 1) <> '-' THEN
            RETURN format('traceparent "%s" is not a version 00 traceparent (00-<32 lowercase hex trace id>-<16 lowercase hex parent id>-<flags 00 to 03>)',
                          CASE WHEN length(p_value) > 80 THEN left(p_value, 80) || '...' ELSE p_value END);
        ELSIF substr(p_value, 4, 32) = repeat('0', 32) THEN
            RETURN 'traceparent has a trace id of all zeros, which is invalid';
        ELSIF substr(p_value, 37, 16) = repeat('0', 16) THEN
            RETURN 'traceparent has a parent id of all zeros, which is invalid';
        END IF;
        RETURN NULL;
    END IF;

    IF NOT p_has_traceparent THEN
        RETURN 'tracestate is given without a traceparent';
    END IF;
    IF octet_length(p_value) > 512 THEN
        RETURN format('tracestate is %s bytes, over the limit of 512', octet_length(p_value));
    END IF;
    FOREACH v_member IN ARRAY string_to_array(p_value, ',') LOOP
        CONTINUE WHEN v_member = '';
        -- Spaces around a member, not inside it: as OpenTelemetry reads it.
        v_key := ltrim(split_part(v_member, '=', 1), ' ');
        v_value := rtrim(substr(v_member, strpos(v_member, '=') + 1), ' ');
        IF strpos(v_member, '=') = 0
           OR NOT ((v_key ~ '^[a-z][a-z0-9_*/-]*$' AND length(v_key) <= 256)
                   OR (v_key ~ '^[a-z0-9][a-z0-9_*/-]*@[a-z][a-z0-9_*/-]*$'
                       AND length(split_part(v_key, '@', 1)) <= 241 AND length(split_part(v_key, '@', 2)) <= 14)) THEN
            RETURN format('tracestate member "%s" is not key=value with a lowercase key',
                          CASE WHEN length(v_member) > 80 THEN left(v_member, 80) || '...' ELSE v_member END);
        ELSIF length(v_value) NOT BETWEEN 1 AND 256 OR v_value !~ '^[\x20-\x2b\x2d-\x3c\x3e-\x7e]*[\x21-\x2b\x2d-\x3c\x3e-\x7e]$' THEN
            RETURN format('tracestate member "%s" has a value that is empty, ends in a space or holds a comma or an equals sign',
                          CASE WHEN length(v_member) > 80 THEN left(v_member, 80) || '...' ELSE v_member END);
        ELSIF v_key = ANY (v_keys) THEN
            RETURN format('tracestate has the key "%s" twice', v_key);
        END IF;
        v_keys := v_keys || v_key;
        IF cardinality(v_keys) > 32 THEN
            RETURN 'tracestate has more than 32 members';
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;
REVOKE ALL ON FUNCTION outbox.trace_context_problem(p_name text, p_value text, p_has_traceparent boolean) FROM PUBLIC;
