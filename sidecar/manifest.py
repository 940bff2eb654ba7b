"""The commit record: one JSON manifest per checkpoint, written last, create-only.

``parse`` accepts only well-formed manifests whose names and keys stay inside their root;
anything else raises :class:`ManifestError` naming what is wrong. ``same_content`` is the
comparison used when a create-only write meets an existing manifest.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from sidecar.storage.keys import UnsafeKey, check_key

__all__ = [
    "FORMAT",
    "LATEST_KEY",
    "MANIFEST_PREFIX",
    "Manifest",
    "ManifestError",
    "ManifestFile",
    "manifest_key",
    "object_base",
    "parse",
    "rfc3339",
]

FORMAT = 1
MANIFEST_PREFIX = ".ckpt-sidecar/manifests/"
LATEST_KEY = ".ckpt-sidecar/LATEST"


class ManifestError(ValueError):
    """Not a manifest we can trust; the message says why."""


@dataclass(frozen=True)
class ManifestFile:
    """One file: ``path`` inside the entry (the entry name for a single file), its object key."""

    path: str
    key: str
    size: int
    crc32c: str


@dataclass(frozen=True)
class Manifest:
    name: str
    generation: int
    layout: str
    is_dir: bool
    step: int | None
    sequence: int
    completed_at: str
    committed_at: str
    host: str
    sidecar_version: str
    files: tuple[ManifestFile, ...]

    @property
    def key(self) -> str:
        return manifest_key(self.name, self.generation)

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def order(self) -> tuple[int, int]:
        """Newer sorts higher: (step, commit sequence); no step sorts before any step."""
        return (self.step if self.step is not None else -1, self.sequence)

    def committed_ts(self) -> float | None:
        """``committed_at`` as seconds since the epoch (a time without a zone is UTC, as the
        daemon writes them), or None when it cannot be read."""
        try:
            when = datetime.fromisoformat(self.committed_at)
        except ValueError:
            return None
        return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()

    def same_content(self, other: Manifest) -> bool:
        """Same entry, same files, same bytes: the commit already happened."""
        return (self.name, self.is_dir, self.files) == (other.name, other.is_dir, other.files)

    def to_json(self) -> bytes:
        data = asdict(self)
        data = {"format": FORMAT, **data}
        data["files"] = [asdict(f) for f in self.files]
        return json.dumps(data, indent=1, ensure_ascii=False).encode("utf-8")


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def object_base(name: str, generation: int) -> str:
    """Where a generation's objects live: ``name`` for the first, ``name@g<N>`` after."""
    return name if generation == 0 else f"{name}@g{generation}"


def manifest_key(name: str, generation: int) -> str:
    return f"{MANIFEST_PREFIX}{object_base(name, generation)}.json"


def _field(d: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in d:
        raise ManifestError(f"{where}: missing field {key!r}")
    v = d[key]
    if not isinstance(v, kind) or (isinstance(v, bool) and kind is int):
        raise ManifestError(f"{where}: field {key!r} has the wrong type")
    return v


def _safe(value: str, where: str) -> str:
    try:
        check_key(value)
        value.encode("utf-8")
    except UnsafeKey as e:
        raise ManifestError(f"{where}: {e}") from None
    except UnicodeEncodeError:
        raise ManifestError(f"{where}: {value!r} is not valid Unicode text") from None
    return value


def _crc(value: str, where: str) -> str:
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise ManifestError(f"{where}: crc32c {value!r} is not base64") from None
    if len(raw) != 4:
        raise ManifestError(f"{where}: crc32c {value!r} is not 4 bytes")
    return value


def parse(data: bytes, where: str = "manifest") -> Manifest:
    """Parse and validate; raise :class:`ManifestError`."""
    try:
        d = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as e:  # bad UTF-8, bad JSON, absurd numbers or nesting
        raise ManifestError(f"{where}: not JSON ({type(e).__name__}: {e})") from None
    if not isinstance(d, dict):
        raise ManifestError(f"{where}: not a JSON object")
    if d.get("format") != FORMAT:
        raise ManifestError(f"{where}: unknown format {d.get('format')!r}; expected {FORMAT}")
    name = _safe(_field(d, "name", str, where), where)
    if "/" in name or "@" in name:
        raise ManifestError(f"{where}: entry name {name!r} must be one path component")
    if name.startswith("."):  # never a checkpoint: the daemon's own files start with "."
        raise ManifestError(f"{where}: entry name {name!r} starts with '.'")
    step = d.get("step")
    if step is not None and (not isinstance(step, int) or isinstance(step, bool) or step < 0):
        raise ManifestError(f"{where}: field 'step' must be a non-negative integer or null")
    gen = _field(d, "generation", int, where)
    seq = _field(d, "sequence", int, where)
    if gen < 0 or seq < 0:
        raise ManifestError(f"{where}: generation and sequence must be >= 0")
    is_dir = _field(d, "is_dir", bool, where)
    raw_files = _field(d, "files", list, where)
    if not raw_files:
        raise ManifestError(f"{where}: names no files")
    files = []
    seen = set()
    for i, f in enumerate(raw_files):
        w = f"{where}: files[{i}]"
        if not isinstance(f, dict):
            raise ManifestError(f"{w}: not an object")
        path = _safe(_field(f, "path", str, w), w)
        key = _safe(_field(f, "key", str, w), w)
        if not is_dir and path != name:
            raise ManifestError(f"{w}: a single-file checkpoint's path must be its name")
        if path in seen:
            raise ManifestError(f"{w}: path {path!r} listed twice")
        seen.add(path)
        size = _field(f, "size", int, w)
        if size < 0:
            raise ManifestError(f"{w}: negative size")
        files.append(ManifestFile(path, key, size, _crc(_field(f, "crc32c", str, w), w)))
    folders = {p.rsplit("/", i)[0] for p in seen for i in range(1, p.count("/") + 1)}
    if clash := sorted(folders & seen):
        raise ManifestError(f"{where}: {clash[0]!r} is both a file and a folder")
    return Manifest(
        name=name,
        generation=gen,
        layout=str(d.get("layout", "plain")),
        is_dir=is_dir,
        step=step,
        sequence=seq,
        completed_at=str(d.get("completed_at", "")),
        committed_at=str(d.get("committed_at", "")),
        host=str(d.get("host", "")),
        sidecar_version=str(d.get("sidecar_version", "")),
        files=tuple(files),
    )
