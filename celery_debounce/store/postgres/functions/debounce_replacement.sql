-- debounce_replacement: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- The body a replacing join stores: the call's arguments with the window's embed
-- (callbacks, errbacks, chain, chord: the opener's, never a joiner's). JSON: the call's
-- [args, kwargs] with the window's third element. Another content type: the call's body
-- when its embed is the window's. Otherwise refused (DBR01), as is a call of another
-- content type than the window's: a window runs with its opener's serializer.
CREATE OR REPLACE FUNCTION debounce_replacement(
    p_task_id text, p_window_ct text, p_window_payload bytea, p_window_embed text,
    p_ct text, p_payload bytea, p_embed text) RETURNS bytea
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_mine json;
    v_theirs json;
BEGIN
    IF p_window_ct <> p_ct THEN
        RETURN debounce_refuse('DBR01', format(
            'window %s was opened with content type %s, this call has %s: a window runs '
            'with its opener''s serializer; call with the same serializer',
            p_task_id, p_window_ct, p_ct), NULL::bytea);
    END IF;
    IF p_ct IN ('', 'application/json') THEN
        BEGIN
            v_mine := convert_from(p_payload, 'UTF8')::json;
            v_theirs := convert_from(p_window_payload, 'UTF8')::json;
        EXCEPTION WHEN data_exception OR invalid_text_representation THEN
            v_mine := NULL;
        END;
        IF v_mine IS NULL OR json_typeof(v_mine) <> 'array'
                OR json_array_length(v_mine) < 2 THEN
            RETURN debounce_refuse('DBR01', format(
                'window %s cannot take this call''s body: not a JSON [args, kwargs, embed]',
                p_task_id), NULL::bytea);
        END IF;
        IF json_typeof(v_theirs) <> 'array' OR json_array_length(v_theirs) < 3 THEN
            RETURN p_payload;  -- no embed to keep
        END IF;
        RETURN convert_to(json_build_array(v_mine -> 0, v_mine -> 1, v_theirs -> 2)::text,
                          'UTF8');
    END IF;
    IF p_window_embed IS NULL OR p_window_embed = coalesce(p_embed, '') THEN
        RETURN p_payload;
    END IF;
    RETURN debounce_refuse('DBR01', format(
        'window %s was opened with other link/link_error/chain/chord options, and a %s '
        'body cannot take this call''s arguments apart from them; call with the opener''s '
        'options, or with serializer=''json''', p_task_id, p_ct), NULL::bytea);
END
$$;
