-- Schema version 5 -> 6: task definitions (producer/published.py), what a producer by
-- name (another language) reads of each debounced task.
--
-- debounce_tasks  one row per debounced task: its definition JSON, written by workers
--                 at start and by `celery debounce publish` when new or changed.

CREATE TABLE debounce_tasks (
    name text PRIMARY KEY,
    definition text NOT NULL,
    written_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
