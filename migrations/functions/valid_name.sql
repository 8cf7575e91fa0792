-- valid_name is the one rule for a namespace or topic: 1-128 bytes of
-- letters, digits and . _ : / -, starting with a letter or digit (the Go
-- producer's NamePattern). Inlined into its callers. The pattern has no
-- {0,127}: PostgreSQL's regular expressions are far slower with a bounded
-- repetition (docs/PERFORMANCE.md), so the length is checked apart.
CREATE OR REPLACE FUNCTION outbox.valid_name(p_name text)
RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT octet_length(p_name) BETWEEN 1 AND 128 AND p_name ~ '^[A-Za-z0-9][A-Za-z0-9._:/-]*$'
$$;
REVOKE ALL ON FUNCTION outbox.valid_name(p_name text) FROM PUBLIC;
