-- is_paused is whether a (namespace, topic) is paused now, by the
-- table rather than the mark: what counts as paused for stats() and the
-- listings even for a message that missed its mark. Not executable by any
-- runtime role.
CREATE OR REPLACE FUNCTION outbox.is_paused(p_namespace text, p_topic text)
RETURNS boolean
LANGUAGE sql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT EXISTS (SELECT 1 FROM outbox.paused z WHERE z.namespace = p_namespace AND z.topic IN (p_topic, '*'))
$$;
REVOKE ALL ON FUNCTION outbox.is_paused(p_namespace text, p_topic text) FROM PUBLIC;
