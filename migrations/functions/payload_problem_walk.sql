-- payload_problem_walk is payload_problem's walk of the document itself.
CREATE OR REPLACE FUNCTION outbox.payload_problem_walk(p_payload jsonb)
RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    -- The root is level 0: a container at level 10,000 is the 10,001st.
    IF jsonb_path_exists(p_payload, 'strict $.**{10000} ? (@.type() == "array" || @.type() == "object")') THEN
        RETURN 'nests arrays and objects more than 10000 deep';
    END IF;
    IF jsonb_path_exists(p_payload, 'strict $.** ? (@.type() == "number" && (@ >= 1e1000 || @ <= -1e1000 || (@ != 0 && @ < 1e-1000 && @ > -1e-1000)))') THEN
        RETURN 'has a number beyond ±1e1000 or nearer to zero than ±1e-1000 (it would be stored as over a thousand digits)';
    END IF;
    RETURN NULL;
END;
$$;
REVOKE ALL ON FUNCTION outbox.payload_problem_walk(p_payload jsonb) FROM PUBLIC;
