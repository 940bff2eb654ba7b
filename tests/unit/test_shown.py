"""Names from the store reach a terminal only with their control characters escaped."""

from __future__ import annotations

import pytest

from sidecar.shown import shown


@pytest.mark.parametrize(
    ("text", "printed"),
    [
        ("step_1.pt", "step_1.pt"),
        ("step_\x1b]0;owned\x07", "step_\\x1b]0;owned\\x07"),
        ("a\nb\tc", "a\\nb\\tc"),
        ("del\x7f c1\x9b", "del\\x7f c1\\x9b"),
        ("ünïcode ✓", "ünïcode ✓"),
    ],
)
def test_control_characters_are_escaped_and_the_rest_kept(text: str, printed: str) -> None:
    assert shown(text) == printed
