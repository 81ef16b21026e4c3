-- debounce_wake_channel: applied with CREATE OR REPLACE by every migrate, after the steps
-- (schema.py FUNCTIONS gives the order).

-- The wake channel of this schema (dispatchers LISTEN on it): NOTIFY when a window
-- becomes the earliest due or is made due now (flush, the cap, a leading run, a held
-- window freed). One per schema, so that two apps in one database wake only their own.
CREATE OR REPLACE FUNCTION debounce_wake_channel() RETURNS text
    LANGUAGE sql STABLE
    AS $$ SELECT left('debounce_wake:' || current_schema(), 63) $$;
