-- payload_problem says what is wrong with a parsed payload that PostgreSQL
-- stores but that no one should send (NULL when nothing is): arrays and
-- objects nested deeper than 10,000 (Go's encoding/json refuses them, so a
-- dispatcher could not send them), and numbers beyond ±1e1000 or nearer to
-- zero than ±1e-1000, which jsonb writes out in full (up to 131,072 digits
-- for a number of eight bytes): their stored size is measured only once
-- they are refused. The Go producer refuses the same (shared/outbox).
-- Inlined into its callers; two walks of the document, cheaper than any
-- look at its text would be (docs/PERFORMANCE.md).
CREATE OR REPLACE FUNCTION outbox.payload_problem(p_payload jsonb)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
-- The root is level 0: a container at level 10,000 is the 10,001st.
SELECT CASE
    WHEN jsonb_path_exists(p_payload, 'strict $.**{10000} ? (@.type() == "array" || @.type() == "object")') THEN
        'nests arrays and objects more than 10000 deep'
    WHEN jsonb_path_exists(p_payload, 'strict $.** ? (@.type() == "number" && (@ >= 1e1000 || @ <= -1e1000 || (@ != 0 && @ < 1e-1000 && @ > -1e-1000)))') THEN
        'has a number beyond ±1e1000 or nearer to zero than ±1e-1000 (it would be stored as over a thousand digits)'
    END
$$;
REVOKE ALL ON FUNCTION outbox.payload_problem(p_payload jsonb) FROM PUBLIC;
