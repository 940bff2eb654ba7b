"""Suite-wide fixtures. Real servers are started by the modules listed in pytest_plugins."""

from __future__ import annotations

pytest_plugins: list[str] = []
