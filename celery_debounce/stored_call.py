"""What every stage knows of a stored call, whatever the store: its content type's
default, its options' JSON codec and its task id.
"""

from __future__ import annotations

import os
from typing import Any

from kombu.utils import json as kombu_json

#: Content type not stored in a window record (``ct`` absent means this).
DEFAULT_CONTENT_TYPE = "application/json"

#: Stored options of a call that has none (``o`` absent means this).
EMPTY_OPTIONS = "{}"


# -- stored options ----------------------------------------------------------------------


def encode_options(stored: dict[str, Any]) -> str:
    """Stored options as JSON (kombu's encoder, as the Redis transport uses).
    Raises TypeError/ValueError for a value JSON cannot hold."""
    return EMPTY_OPTIONS if not stored else str(kombu_json.dumps(stored))


def decode_options(text: str) -> dict[str, Any]:
    """The stored options of a record; ValueError when they are not a JSON object."""
    opts = kombu_json.loads(text) if text != EMPTY_OPTIONS else {}
    if not isinstance(opts, dict):
        raise ValueError("options are not a JSON object")
    return opts


def new_task_id() -> str:
    """A random (version 4) UUID as text, like ``str(uuid.uuid4())`` at a third of the cost."""
    raw = bytearray(os.urandom(16))
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
