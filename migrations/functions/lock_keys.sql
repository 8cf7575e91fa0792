-- lock_keys creates the keys' rows if they are missing and locks them, in
-- key order, waiting for whoever holds them. Everyone who waits for a key's
-- lock takes it before touching the key's messages, so that no one holding
-- a key's lock ever waits for them.
CREATE OR REPLACE FUNCTION outbox.lock_keys(p_namespaces text[], p_keys text[])
RETURNS void
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
-- The keys given, by primary key: see outbox.claim_batch.
SET jit = off
AS $$
BEGIN
    IF coalesce(cardinality(p_keys), 0) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO outbox.keys (namespace, ordering_key)
    SELECT DISTINCT k.ns, k.ok FROM unnest(p_namespaces, p_keys) AS k(ns, ok) ORDER BY 1, 2
    ON CONFLICT ON CONSTRAINT keys_pkey DO NOTHING;
    PERFORM 1 FROM (SELECT k.namespace, k.ordering_key FROM outbox.keys k
                    WHERE (k.namespace, k.ordering_key) IN (SELECT * FROM unnest(p_namespaces, p_keys))
                    ORDER BY 1, 2
                    FOR UPDATE) x;
END;
$$;
REVOKE ALL ON FUNCTION outbox.lock_keys(p_namespaces text[], p_keys text[]) FROM PUBLIC;
