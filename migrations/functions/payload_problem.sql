-- payload_problem says what is wrong with a parsed payload that PostgreSQL
-- stores but that no one should send (NULL when nothing is): arrays and
-- objects nested deeper than 10,000 (Go's encoding/json refuses them, so a
-- dispatcher could not send them), and numbers beyond ±1e1000 or nearer to
-- zero than ±1e-1000, which jsonb writes out in full (up to 131,072 digits
-- for a number of eight bytes). The Go producer refuses the same.
--
-- Inlined into its callers: a look at the text the producer sent decides
-- whether the document must be walked (an exponent of three digits, more
-- than 10,000 brackets); without the text (enqueue's jsonb) it always is.
CREATE OR REPLACE FUNCTION outbox.payload_problem(p_payload jsonb, p_text text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT CASE WHEN p_text IS NULL
              OR p_text ~ '[eE][+-]?0*[1-9][0-9]{2}'
              OR octet_length(p_text) - octet_length(translate(p_text, '[{', '')) > 10000
            THEN outbox.payload_problem_walk(p_payload) END
$$;
REVOKE ALL ON FUNCTION outbox.payload_problem(p_payload jsonb, p_text text) FROM PUBLIC;
