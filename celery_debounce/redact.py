"""URLs in error messages and logs without their passwords (every store, the broker)."""

from __future__ import annotations

import re

#: Where a URL starts in a text: its scheme and ``://``.
_URL_START = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")
_QUOTES = "'\""
#: A password given as a URL's query parameter (libpq's ``?password=``, ``sslpassword``):
#: its value runs to the next ``&`` or the URL's end.
_QUERY_SECRET = re.compile(r"(?i)([?&](?:ssl)?password=)[^&]*")


def redact(text: str) -> str:
    """``text`` with the password of every URL in it replaced by ``***``.

    For error messages and logs: ``text`` may be a URL, several (``;``-separated
    sentinels, a broker failover list) or a message quoting them. A URL's user info
    runs to its **last** ``@`` (before the next URL, a blank, or the quote that opened
    it), so a password pasted with ``;``, ``/``, ``@`` or ``:`` unencoded is hidden
    whole; a user info without ``:`` is hidden whole too (some write a password there).
    A ``password`` (or ``sslpassword``) query parameter is hidden too.
    """
    if "@" not in text and "password=" not in text.lower():
        return text
    starts = list(_URL_START.finditer(text))
    out: list[str] = []
    pos = 0
    for i, match in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        blank = re.search(r"\s", text[match.end() : end])
        if blank:
            end = match.end() + blank.start()
        before = text[match.start() - 1] if match.start() > 0 else ""
        if before and before in _QUOTES:
            closing = text.find(before, match.end(), end)
            end = closing if closing >= 0 else end
        segment = _QUERY_SECRET.sub(r"\1***", text[match.end() : end])
        at = segment.rfind("@")
        out.append(text[pos : match.end()])
        if at >= 0:
            user, colon, _ = segment[:at].partition(":")
            out.append((f"{user}:***" if colon and "/" not in user else "***") + segment[at:])
        else:
            out.append(segment)
        pos = end
    out.append(text[pos:])
    return "".join(out)
