"""Validation of object keys and relative paths: nothing may escape its root."""

from __future__ import annotations

from pathlib import PurePosixPath

__all__ = ["UnsafeKey", "check_key", "safe_relative"]


class UnsafeKey(ValueError):
    """A key or relative path that is empty, absolute, or would leave its root."""


def check_key(key: str) -> str:
    """Return ``key`` if it is a safe relative ``/``-separated key; else :class:`UnsafeKey`."""
    if not key or "\x00" in key or "\\" in key:
        raise UnsafeKey(f"unsafe key {key!r}: empty, NUL or backslash")
    if key.startswith("/"):
        raise UnsafeKey(f"unsafe key {key!r}: absolute")
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise UnsafeKey(f"unsafe key {key!r}: empty, '.' or '..' segment")
    return key


def safe_relative(rel: str) -> PurePosixPath:
    """A relative path that stays under its root when joined; raise :class:`UnsafeKey`."""
    return PurePosixPath(check_key(rel))
