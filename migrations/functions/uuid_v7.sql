-- PostgreSQL 15 has no uuidv7(). This one follows RFC 9562 method 3, as
-- PostgreSQL 18's does: 48 bits of Unix milliseconds, then the version and 12
-- bits of sub-millisecond time, then 62 random bits (with the variant taken
-- from a v4 UUID). Ids made one after another sort in creation order, which
-- keeps the primary key append-mostly and makes (next_attempt_at, id) a FIFO.
-- Every call is schema-qualified instead of pinning search_path with SET,
-- which would cost a configuration save and restore on each of the
-- thousands of calls a batch makes.
CREATE OR REPLACE FUNCTION outbox.uuid_v7() RETURNS uuid
LANGUAGE plpgsql VOLATILE PARALLEL SAFE
AS $$
DECLARE
    v_ms numeric := pg_catalog.extract('epoch', pg_catalog.clock_timestamp()) OPERATOR(pg_catalog.*) 1000;
    v_whole numeric := pg_catalog.floor(v_ms);
BEGIN
    RETURN pg_catalog.encode(
        pg_catalog.substr(pg_catalog.int8send(v_whole::pg_catalog.int8), 3)
        OPERATOR(pg_catalog.||) pg_catalog.int2send((28672 OPERATOR(pg_catalog.+) pg_catalog.floor((v_ms OPERATOR(pg_catalog.-) v_whole) OPERATOR(pg_catalog.*) 4096)::pg_catalog.int4)::pg_catalog.int2)  -- 0x7000: version 7
        OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.uuid_send(pg_catalog.gen_random_uuid()), 9),
        'hex')::pg_catalog.uuid;
END;
$$;
REVOKE ALL ON FUNCTION outbox.uuid_v7() FROM PUBLIC;
