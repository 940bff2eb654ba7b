"""The Prometheus rules and the Grafana dashboard name only metrics the daemon exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client import CollectorRegistry

from sidecar.metrics import Metrics

ROOT = Path(__file__).parents[2]
_NAME = re.compile(r"\bckpt_sidecar_[a-z0-9_]+")


def exported() -> set[str]:
    """Every sample name the daemon can export (with _total, _bucket... suffixes)."""
    reg = CollectorRegistry()
    m = Metrics(reg)
    m.build.info({"version": "x", "backend": "file"})
    for lbl in (m.bytes_uploaded, m.files_uploaded):
        lbl.labels("file", "ok")
    m.retries.labels("put_file", "TransientError")
    m.errors.labels("commit", "PermanentError")
    m.notices.labels("aws", "terminate")
    m.drains.labels("committed")
    names = set()
    for fam in reg.collect():
        for s in fam.samples:
            names.add(s.name)
    return names


def test_metric_names_follow_prometheus_conventions() -> None:
    names = exported()
    assert all(n.startswith("ckpt_sidecar_") for n in names)
    counters = {n for n in names if n.endswith("_total")}
    assert "ckpt_sidecar_uploaded_bytes_total" in counters
    assert "ckpt_sidecar_unprotected_seconds" in names
    assert "ckpt_sidecar_commit_latency_seconds_bucket" in names


def test_alert_rules_are_well_formed_and_name_exported_metrics() -> None:
    doc = yaml.safe_load((ROOT / "deploy/prometheus/rules.yaml").read_text())
    names = exported()
    alerts = [r for g in doc["groups"] for r in g["rules"]]
    assert {a["alert"] for a in alerts} >= {
        "CkptSidecarUnprotected",
        "CkptSidecarNoCommit",
        "CkptSidecarStoragePermanentError",
        "CkptSidecarDrainMissed",
    }
    for a in alerts:
        assert a["labels"]["severity"] in ("warning", "critical")
        assert a["annotations"]["summary"]
        used = set(_NAME.findall(a["expr"]))
        assert used, a["alert"]
        assert used <= names, f"{a['alert']} names unknown metrics {used - names}"
        assert a["expr"].count("(") == a["expr"].count(")")


def test_dashboard_queries_name_exported_metrics() -> None:
    dash = json.loads((ROOT / "deploy/grafana/ckpt-sidecar.json").read_text())
    names = exported()
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert len(exprs) >= 10
    for e in exprs:
        used = set(_NAME.findall(e))
        assert used and used <= names, f"{e} names unknown metrics {used - names}"
    covered = {n for e in exprs for n in _NAME.findall(e)}
    base = {
        re.sub(r"_(bucket|count|sum|total|info)$", "", n)
        for n in names
        if not n.endswith("_created")
    }
    missing = base - {re.sub(r"_(bucket|count|sum|total|info)$", "", n) for n in covered}
    assert not missing, f"metrics without a panel: {missing}"
