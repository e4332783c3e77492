"""Text for a terminal: what a sender chose (a request target, a detail key, an error message)
never reaches the operator's terminal as control characters.

``printable`` is the one helper: every line ``opstate serve`` prints (``--verbose`` request
lines, state changes, errors) and every line the CLI prints as text goes through it. It
escapes C0 (but TAB) and C1 control characters (ESC, CR, LF, BEL, ...), DEL, the line and paragraph
separators and the bidirectional overrides (which reorder what follows on screen) as
``\\xNN`` / ``\\uNNNN``; everything else, including other non-ASCII text, is kept as it is.
JSON output needs none of this: ``strict_json.dumps`` escapes control characters itself.

Pure: imports nothing.
"""

from __future__ import annotations

import re

# C0 controls but TAB, DEL, C1 controls; U+2028/2029; bidi marks, embeddings, overrides and
# isolates.
_UNSAFE = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]"
)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str) -> str:
    """``text`` with every control character escaped (one line stays one line)."""
    return _UNSAFE.sub(_escape, text)


def printable_lines(text: str) -> str:
    """``text`` of several lines (``\\n``-separated, as the program wrote it), each line made
    ``printable``: the program's own line breaks stay, anything else is escaped."""
    return "\n".join(printable(line) for line in text.split("\n"))
