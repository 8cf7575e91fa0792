-- stored_bytes is the size measure of a payload: the bytes of its JSON text
-- as PostgreSQL keeps and returns it (jsonb's own text: numbers written out
-- in full, keys sorted and deduplicated, escapes resolved), which is what a
-- claim loads and a dispatcher sends. The producer's text can be far
-- shorter (1e1000 is six bytes and prints as a thousand and one), so limits
-- and payload_bytes are measured here, never on the text sent. Inlined
-- into its callers; payload_problem refuses first what would take too long
-- to write out.
CREATE OR REPLACE FUNCTION outbox.stored_bytes(p_document jsonb)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $$
SELECT octet_length(p_document::text)
$$;
REVOKE ALL ON FUNCTION outbox.stored_bytes(p_document jsonb) FROM PUBLIC;
