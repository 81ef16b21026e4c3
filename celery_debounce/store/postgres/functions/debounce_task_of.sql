-- debounce_task_of: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- The task name in an ident <n>:<task>:<key> (n: the name's UTF-8 bytes, as
-- keys.ident_prefix writes it): the first characters after "<n>:" that make n bytes.
-- NULL for an ident of another shape; never an error (a take counts every window it
-- takes with it: one malformed ident must not fail the take of the others).
CREATE OR REPLACE FUNCTION debounce_task_of(p_ident text) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    v_colon integer := position(':' IN p_ident);
    v_n integer;
    v_rest text;
BEGIN
    IF v_colon < 2 OR v_colon > 10 OR left(p_ident, v_colon - 1) !~ '^[0-9]+$' THEN
        RETURN NULL;
    END IF;
    v_n := left(p_ident, v_colon - 1)::integer;
    v_rest := substr(p_ident, v_colon + 1);
    IF octet_length(left(v_rest, v_n)) = v_n THEN  -- one byte a character: the usual
        RETURN left(v_rest, v_n);
    END IF;
    FOR v_c IN 1 .. v_n - 1 LOOP  -- fewer characters than bytes
        IF octet_length(left(v_rest, v_c)) = v_n THEN
            RETURN left(v_rest, v_c);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;
