"""Registers the ``wheel`` marker (select the packaging test alone with ``-m wheel``)."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "wheel: builds the wheel and runs it from a fresh venv (part of the default run)"
    )
