"""Text from the store (checkpoint names, object keys) made safe to print on a terminal.

``shown(text)`` returns ``text`` with every control character (C0, DEL, C1) written as a
Python escape (``\\n``, ``\\x1b``), so a name holding an escape sequence cannot move the
cursor, retitle the window or hide output; everything else is unchanged.
"""

from __future__ import annotations

import re

__all__ = ["shown"]

_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def shown(text: str) -> str:
    return _CONTROL.sub(lambda m: repr(m.group())[1:-1], text)
