"""The PostgreSQL store's task definitions (a base of ``PostgresStore``): table
``debounce_tasks`` (``steps/6.sql``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .step import many, one

#: Each row that is new or changed, written; the names written.
_PUBLISH = (
    "INSERT INTO debounce_tasks AS t (name, definition) "
    "SELECT * FROM unnest(%s::text[], %s::text[]) "
    "ON CONFLICT (name) DO UPDATE SET definition = excluded.definition, "
    "written_at = clock_timestamp() WHERE t.definition IS DISTINCT FROM excluded.definition "
    "RETURNING name"
)
_READ = "SELECT definition FROM debounce_tasks WHERE name = %s"


class PostgresDefinitions:
    """``publish_definitions`` and ``task_definition`` of :class:`~.store.PostgresStore`."""

    if TYPE_CHECKING:  # pragma: no cover - what PostgresStore provides

        def _check(self) -> None: ...
        def _read(self, fn: Any) -> Any: ...
        def _write(self, fn: Any, operation: str) -> Any: ...

    def publish_definitions(self, definitions: Mapping[str, str]) -> int:
        """Write each task's definition (name -> JSON) that is new or changed; how many."""
        if not definitions:
            return 0
        self._check()
        names = list(definitions)
        rows = self._write(many(_PUBLISH, (names, [definitions[n] for n in names])), "publish")
        return len(rows)

    def task_definition(self, task_name: str) -> str | None:
        """The definition JSON published for ``task_name``, or None."""
        self._check()
        row = self._read(one(_READ, (task_name,)))
        return None if row is None else str(row[0])
