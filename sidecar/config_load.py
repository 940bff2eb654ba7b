"""Reading the configuration: YAML file < environment (``CKPT_SIDECAR_<SECTION>__<KEY>``) <
flags, into the schema of :mod:`sidecar.config`.

:func:`load` returns a validated, frozen :class:`~sidecar.config.Config` or raises
:class:`ConfigError`, whose message names every bad key, the value given and what is
allowed, and never a secret. The CLI turns a :class:`ConfigError` into exit status 2 before
anything starts. :func:`redacted` is a config as it may be shown (secrets as ``***``).
"""

from __future__ import annotations

import functools
import json
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, SecretStr, ValidationError

from sidecar.config import ENV_PREFIX, Config

__all__ = ["ConfigError", "load", "redacted"]


class ConfigError(Exception):
    """Invalid configuration; the message is meant for the operator as is."""


def _set_path(tree: dict[str, Any], path: list[str], value: Any, origin: str) -> None:
    node = tree
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{origin}: {'.'.join(path)}: '{part}' is not a section")
        node = child
    node[path[-1]] = value


def _env_value(raw: str) -> Any:
    text = raw.strip()
    if text.startswith(("[", "{")):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return raw  # not JSON: a plain string, e.g. a regular expression "[._-](\d+)"
    return raw


def _is_list(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_is_list(a) for a in typing.get_args(annotation))
    return origin in (list, tuple, set, frozenset)


@functools.cache
def _list_keys(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> frozenset[tuple[str, ...]]:
    """Every list- or tuple-typed key, found by type, so a new list key splits like the rest."""
    out: set[tuple[str, ...]] = set()
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out |= _list_keys(ann, (*prefix, name))
        elif _is_list(ann):
            out.add((*prefix, name))
    return frozenset(out)


def _env_list(name: str, key: str, raw: str) -> Any:
    """A JSON list (``["a", "b"]``) or comma-separated values (``a, b``; also globs such as
    ``[0-9]*,step_*``: text starting with ``[`` is taken for JSON only when it holds a quote
    or ends with ``]``)."""
    text = raw.strip()
    quoted = '"' in text or "'" in text or text.endswith(("]", "}"))
    if text.startswith(("[", "{")) and quoted:  # '[0-9]*,x' is globs, not broken JSON
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(
                f"environment variable {name} ({key}): starts with {text[0]!r} but is not valid "
                f"JSON ({e.msg}, character {e.pos + 1}); give a JSON list such as "
                """'["a", "b"]' or comma-separated values such as a,b"""
            ) from None
    return [v.strip() for v in text.split(",") if v.strip()]


#: The variables Kubernetes puts into every container for each Service of the namespace
#: (``enableServiceLinks``): a Service named ``ckpt-sidecar`` or ``ckpt-sidecar-metrics``
#: gives ``CKPT_SIDECAR_SERVICE_HOST=10.0.0.7``, ``CKPT_SIDECAR_PORT=tcp://10.0.0.7:9477``,
#: ``CKPT_SIDECAR_METRICS_PORT_9477_TCP_ADDR=10.0.0.8`` and the like: each name shape with
#: the value Kubernetes gives it, so a misspelt key (``CKPT_SIDECAR_ADMIN_PORT=9478``) is
#: still refused.
_SERVICE_LINK = {
    re.compile(r"(?:[A-Z0-9_]+_)?SERVICE_HOST"): re.compile(r"[0-9A-Fa-f.:]+"),
    re.compile(r"(?:[A-Z0-9_]+_)?SERVICE_PORT(?:_[A-Z0-9_]+)?"): re.compile(r"[0-9]+"),
    re.compile(r"(?:[A-Z0-9_]+_)?PORT(?:_[0-9]+_(?:TCP|UDP|SCTP))?"): re.compile(
        r"(?:tcp|udp|sctp)://\S+"
    ),
    re.compile(r"(?:[A-Z0-9_]+_)?PORT_[0-9]+_(?:TCP|UDP|SCTP)_PROTO"): re.compile(r"tcp|udp|sctp"),
    re.compile(r"(?:[A-Z0-9_]+_)?PORT_[0-9]+_(?:TCP|UDP|SCTP)_PORT"): re.compile(r"[0-9]+"),
    re.compile(r"(?:[A-Z0-9_]+_)?PORT_[0-9]+_(?:TCP|UDP|SCTP)_ADDR"): re.compile(r"[0-9A-Fa-f.:]+"),
}


def is_service_link(name: str, value: str) -> bool:
    """Whether the environment variable ``name`` (with :data:`ENV_PREFIX`) and its ``value``
    have the shape of a Kubernetes service link rather than a config key."""
    rest = name[len(ENV_PREFIX) :]
    return "__" not in rest and any(
        shape.fullmatch(rest) is not None and held.fullmatch(value) is not None
        for shape, held in _SERVICE_LINK.items()
    )


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    list_keys = _list_keys(Config)
    tree: dict[str, Any] = {}
    for name, raw in sorted(env.items()):
        if not name.startswith(ENV_PREFIX) or is_service_link(name, raw):
            continue
        path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        if not all(path):
            raise ConfigError(f"environment variable {name}: empty section or key name")
        if tuple(path) in list_keys:
            value = _env_list(name, ".".join(path), raw)
        else:
            value = _env_value(raw)
        _set_path(tree, path, value, f"environment variable {name}")
    return tree


def _merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; pass an existing --config") from None
    except OSError as e:
        raise ConfigError(f"config file {path} cannot be read: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {path} is not UTF-8 text (byte {e.start + 1}: {e.reason}); "
            "save it as UTF-8"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"config file {path} is not valid YAML: {_yaml_problem(e)}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping of sections")
    return data


# Quoted parts of PyYAML's messages that cannot hold a value: one character ('\t', ':') or a
# token name ('<block mapping start>'). Anything else quoted (an alias, a tag) may be a secret.
_YAML_SAFE_QUOTE = re.compile(r"'(?:[^'\\]|\\[a-z\\]|<[a-z ]+>)'|\"'\"")


def _yaml_words(text: str | None) -> str | None:
    if not text:
        return None
    if re.search("['\"]", _YAML_SAFE_QUOTE.sub("", text)):
        return "syntax error (details not shown: they would quote the file's text)"
    return text


def _yaml_problem(e: yaml.YAMLError) -> str:
    """Where and what, never the text there: PyYAML's own message quotes the offending line,
    and on a ``sas_token:`` or ``token:`` line that is a secret."""
    if not isinstance(e, yaml.MarkedYAMLError):
        position = getattr(e, "position", None)
        at = f" at character {position + 1}" if isinstance(position, int) else ""
        return f"{type(e).__name__}{at}; fix the file there"
    parts = []
    problem = _yaml_words(e.problem) or "syntax error"
    if e.problem_mark is not None:
        mark = e.problem_mark
        parts.append(f"line {mark.line + 1}, column {mark.column + 1}: {problem}")
    else:
        parts.append(problem)
    context = _yaml_words(e.context)
    if context and e.context_mark is not None:
        mark = e.context_mark
        parts.append(f"({context} started at line {mark.line + 1}, column {mark.column + 1})")
    elif context:
        parts.append(f"({context})")
    return (
        " ".join(parts) + "; fix the syntax there (an unclosed quote or bracket, or a tab in "
        "the indentation, is the usual cause). The line itself is not shown: it may hold a secret"
    )


@functools.cache
def _secret_keys(model: type[BaseModel], prefix: str = "") -> frozenset[str]:
    """Dotted names of every ``SecretStr`` field, found by type, not by name."""
    out: set[str] = set()
    for name, field in model.model_fields.items():
        ann = field.annotation
        if ann is not None and "SecretStr" in str(ann):
            out.add(prefix + name)
        elif isinstance(ann, type) and issubclass(ann, BaseModel):
            out |= _secret_keys(ann, f"{prefix}{name}.")
    return frozenset(out)


def _without_userinfo(value: Any) -> Any:
    """``s3://key:secret@bucket`` -> ``s3://***@bucket``: credentials never reach a message."""
    if isinstance(value, str) and "://" in value:
        scheme, rest = value.split("://", 1)
        host, sep, path = rest.partition("/")
        if "@" in host:
            return f"{scheme}://***@{host.rsplit('@', 1)[1]}{sep}{path}"
    return value


def _describe(err: ValidationError) -> str:
    secrets = _secret_keys(Config)
    lines = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(f"{key}: unknown key; see config.example.yaml for the keys that exist")
            continue
        value = e.get("input")
        msg = str(e["msg"]).removeprefix("Value error, ")
        if isinstance(value, dict):  # a check of a whole section: its message names the keys
            lines.append(f"{key}: {msg}")
            continue
        hidden = any(
            key == s or key.startswith(s + ".") or s.startswith(key + ".") for s in secrets
        )
        shown = "***" if hidden else repr(_without_userinfo(value))
        lines.append(f"{key} = {shown}: {msg}")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def load(
    path: Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """Build the effective config. ``overrides`` maps dotted keys (``watch.path``) to values."""
    tree = _read_yaml(path) if path is not None else {}
    tree = _merge(tree, _from_env(env or {}))
    flag_tree: dict[str, Any] = {}
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_path(flag_tree, dotted.split("."), value, f"flag for {dotted}")
    tree = _merge(tree, flag_tree)
    try:
        return Config.model_validate(tree)
    except ValidationError as e:
        raise ConfigError(_describe(e)) from None


def redacted(cfg: Config) -> dict[str, Any]:
    """The config as plain data with every secret replaced by ``***``."""

    def walk(v: Any) -> Any:
        if isinstance(v, SecretStr):
            return "***"
        if isinstance(v, BaseModel):
            return {k: walk(getattr(v, k)) for k in type(v).model_fields}
        if isinstance(v, Path):
            return str(v)
        if isinstance(v, list):
            return [walk(x) for x in v]
        return v

    out: dict[str, Any] = walk(cfg)
    return out
