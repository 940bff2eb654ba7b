"""The manifest parser: valid manifests round-trip; anything else is a ManifestError."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.manifest import (
    FORMAT,
    Manifest,
    ManifestError,
    ManifestFile,
    manifest_key,
    object_base,
    parse,
)
from sidecar.storage.checksum import crc32c_of_bytes
from sidecar.storage.keys import UnsafeKey, check_key

CRC = crc32c_of_bytes(b"hello")


def doc(**over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "format": FORMAT,
        "name": "step_10",
        "generation": 0,
        "layout": "plain",
        "is_dir": True,
        "step": 10,
        "sequence": 4,
        "completed_at": "2024-01-01T00:00:00.000000Z",
        "committed_at": "2024-01-01T00:00:01.000000Z",
        "host": "gpu-1",
        "sidecar_version": "0.1.0",
        "files": [
            {"path": "model.pt", "key": "step_10/model.pt", "size": 5, "crc32c": CRC},
            {"path": "sub/opt.pt", "key": "step_10/sub/opt.pt", "size": 0, "crc32c": CRC},
        ],
    }
    d.update(over)
    return d


def raw(d: Any) -> bytes:
    return json.dumps(d).encode()


def file_doc(**over: Any) -> dict[str, Any]:
    f = {"path": "model.pt", "key": "step_10/model.pt", "size": 5, "crc32c": CRC}
    f.update(over)
    return doc(files=[f])


def assert_trustworthy(m: Manifest) -> None:
    """What restore relies on for every manifest that parses."""
    check_key(m.name)
    assert "/" not in m.name and "@" not in m.name
    paths = [f.path for f in m.files]
    assert m.files and len(set(paths)) == len(paths)
    for f in m.files:
        check_key(f.path)
        check_key(f.key)
        assert f.size >= 0
        assert m.is_dir or f.path == m.name
    assert parse(m.to_json()) == m, "a parsed manifest writes back to the same manifest"


def test_valid_manifest_round_trips() -> None:
    m = parse(raw(doc()), where="x.json")
    assert m.name == "step_10" and m.step == 10 and m.sequence == 4 and m.is_dir
    assert m.files[1] == ManifestFile("sub/opt.pt", "step_10/sub/opt.pt", 0, CRC)
    assert m.size == 5
    assert m.key == ".ckpt-sidecar/manifests/step_10.json"
    assert parse(m.to_json()) == m
    assert json.loads(m.to_json())["format"] == FORMAT
    assert_trustworthy(m)


def test_generation_keys() -> None:
    assert object_base("last.ckpt", 0) == "last.ckpt"
    assert object_base("last.ckpt", 3) == "last.ckpt@g3"
    assert manifest_key("last.ckpt", 3) == ".ckpt-sidecar/manifests/last.ckpt@g3.json"
    m = parse(raw(doc(generation=2)))
    assert m.key == ".ckpt-sidecar/manifests/step_10@g2.json"


def test_order_is_step_then_sequence_and_no_step_sorts_first() -> None:
    a = parse(raw(doc(step=5, sequence=9)))
    b = parse(raw(doc(step=6, sequence=1)))
    c = parse(raw(doc(step=None, sequence=99)))
    d = parse(raw(doc(step=6, sequence=2)))
    assert sorted([a, b, c, d], key=Manifest.order) == [c, a, b, d]


def test_same_content_ignores_times_and_sequence_but_not_bytes() -> None:
    m = parse(raw(doc()))
    later = parse(raw(doc(sequence=50, committed_at="later", host="other")))
    assert m.same_content(later)
    other_crc = doc()
    other_crc["files"][0]["crc32c"] = crc32c_of_bytes(b"world")
    assert not m.same_content(parse(raw(other_crc)))
    assert not m.same_content(parse(raw(doc(name="step_11"))))


@pytest.mark.parametrize(
    "bad",
    [
        "..",
        "../x",
        "a/../../b",
        "/etc/passwd",
        "a\x00b",
        "a\\..\\b",
        "",
        "./a",
        "a//b",
        "a/.",
    ],
)
@pytest.mark.parametrize("field", ["path", "key"])
def test_unsafe_file_paths_and_keys_are_refused(bad: str, field: str) -> None:
    with pytest.raises(ManifestError, match=r"m\.json: files\[0\]"):
        parse(raw(file_doc(**{field: bad})), where="m.json")


@pytest.mark.parametrize(
    "bad",
    [
        "..",
        "/abs",
        "a/b",
        "x@g1",
        "a\x00",
        "",
        ".ckpt-sidecar-notice.json",  # restored, it would tell the trainer to stop
        ".ckpt-sidecar-state",
    ],
)
def test_unsafe_or_compound_entry_names_are_refused(bad: str) -> None:
    with pytest.raises(ManifestError):
        parse(raw(doc(name=bad)))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not JSON"),
        (b"\xff\xfe{}", "not JSON"),
        (b"{", "not JSON"),
        (b"[]", "not a JSON object"),
        (raw(doc(format=2)), "unknown format 2"),
        (raw({k: v for k, v in doc().items() if k != "format"}), "unknown format None"),
        (raw({k: v for k, v in doc().items() if k != "name"}), "missing field 'name'"),
        (raw(doc(generation="0")), "'generation' has the wrong type"),
        (raw(doc(sequence=True)), "'sequence' has the wrong type"),
        (raw(doc(generation=-1)), ">= 0"),
        (raw(doc(step=-3)), "'step' must be a non-negative integer"),
        (raw(doc(step=1.5)), "'step' must be a non-negative integer"),
        (raw(doc(is_dir="yes")), "'is_dir' has the wrong type"),
        (raw(doc(files=[])), "names no files"),
        (raw(doc(files={"a": 1})), "'files' has the wrong type"),
        (raw(doc(files=["model.pt"])), "not an object"),
        (raw(file_doc(size=-1)), "negative size"),
        (raw(file_doc(size="5")), "'size' has the wrong type"),
        (raw(file_doc(crc32c="not base64!")), "is not base64"),
        (raw(file_doc(crc32c="AAAA")), "is not 4 bytes"),
        (raw(doc(is_dir=False, name="m.pt")), "single-file checkpoint's path must be its name"),
    ],
)
def test_malformed_manifests_are_refused_with_a_reason(data: bytes, message: str) -> None:
    with pytest.raises(ManifestError) as e:
        parse(data, where="k.json")
    assert str(e.value).startswith("k.json")
    assert message in str(e.value)


def test_duplicate_paths_are_refused() -> None:
    d = doc()
    d["files"][1]["path"] = "model.pt"
    with pytest.raises(ManifestError, match="listed twice"):
        parse(raw(d))


# -- fuzzing -------------------------------------------------------------------------------
def parse_or_refuse(data: bytes) -> None:
    try:
        m = parse(data)
    except ManifestError as e:
        assert str(e), "a refusal says why"
        return
    assert_trustworthy(m)


@given(st.binary(max_size=2000))
@settings(max_examples=200, deadline=None, database=None)
def test_any_bytes_parse_or_raise_manifest_error(data: bytes) -> None:
    parse_or_refuse(data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**20), 10**20) | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
unsafe_text = st.sampled_from(
    ["..", "../../etc/passwd", "/abs", "a/../b", "a\x00", "", "a//b", "."]
)
field_value = json_values | unsafe_text | st.text(max_size=30)


@st.composite
def mutated_manifests(draw: st.DrawFn) -> bytes:
    d = doc(is_dir=draw(st.booleans()))
    if not d["is_dir"]:
        d["name"] = "model.pt"
        d["files"] = [dict(d["files"][0], path="model.pt", key="model.pt")]
    for _ in range(draw(st.integers(1, 4))):
        target = draw(st.sampled_from(["top", "file", "drop", "drop_file"]))
        if target == "top":
            d[draw(st.sampled_from(sorted(d)))] = draw(field_value)
        elif target == "drop":
            d.pop(draw(st.sampled_from(sorted(d))), None)
        elif isinstance(d.get("files"), list) and d["files"] and isinstance(d["files"][0], dict):
            f = d["files"][0]
            if target == "file":
                f[draw(st.sampled_from(["path", "key", "size", "crc32c", "extra"]))] = draw(
                    field_value
                )
            else:
                f.pop(draw(st.sampled_from(["path", "key", "size", "crc32c"])), None)
    return json.dumps(d, allow_nan=True).encode()


@given(mutated_manifests())
@settings(max_examples=200, deadline=None, database=None)
def test_mutated_manifests_parse_into_trustworthy_ones_or_raise(data: bytes) -> None:
    parse_or_refuse(data)


# -- known bugs, reproduced exactly ----------------------------------------------------------
def _only_manifest_error(data: bytes) -> None:
    try:
        parse_or_refuse(data)
    except (ManifestError, UnsafeKey):
        raise
    except Exception as e:  # anything else escapes Catalog.load and crashes restore/run
        pytest.fail(f"parse raised {type(e).__name__}: {str(e)[:100]}")


def test_integer_with_5000_digits_is_a_manifest_error() -> None:
    _only_manifest_error(b'{"format": 1, "generation": ' + b"9" * 5000 + b"}")


def test_deeply_nested_json_is_a_manifest_error() -> None:
    _only_manifest_error(b"[" * 100_000)


def test_lone_surrogate_in_names_is_refused() -> None:
    d = doc(is_dir=False, name="x\\ud800.pt")
    d["files"] = [{"path": "x\\ud800.pt", "key": "k", "size": 1, "crc32c": CRC}]
    data = json.dumps(d).replace("\\\\ud800", "\\ud800").encode()
    assert b"\\ud800" in data
    _only_manifest_error(data)
