-- debounce_refuse: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- Raise a refusal the store maps to a typed error (SQLSTATE class DB: DBA01 a fixed id
-- past the window's most aliases, DBR01 a replacing join of another content type); the
-- statement that called it is undone, so nothing is written. Typed as p_as, for use in
-- an expression of that type.
CREATE OR REPLACE FUNCTION debounce_refuse(p_code text, p_message text, p_as anyelement)
RETURNS anyelement
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION USING ERRCODE = p_code, MESSAGE = p_message;
END
$$;
