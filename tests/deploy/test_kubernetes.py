"""deploy/kubernetes: rendered by kustomize, validated against the real API schemas, and held to
the daemon's contract (restore first, native sidecar, drain on preStop, probes, security, grace).

Core kinds (ServiceAccount, ConfigMap, Job) are validated strictly (unknown fields rejected) by
``kubernetes-validate`` against Kubernetes 1.29 (the first release with native sidecars on by
default), 1.33 (native sidecars GA) and the newest schema it ships. The JobSet's Job template is
validated the same way by wrapping it in a batch/v1 Job. PodMonitor, PrometheusRule and the
JobSet's own fields are CRDs whose schemas ship with their operators, not with
``kubernetes-validate``; they are parse-checked here for the fields the operators require.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from sidecar.config import Config
from sidecar.config_load import ConfigError, load
from tests.deploy.k8s import EXAMPLES, K8S, container_env, pod_templates, render
from tests.deploy.tools import DEPLOY, dockerfile_user

Doc = dict[str, Any]
VERSIONS = ("1.29", "1.33", kubernetes_validate.latest_version())
CRD_KINDS = {"PodMonitor", "PrometheusRule", "JobSet"}
SIDECAR, RESTORE, TRAINER = "ckpt-sidecar", "restore", "trainer"
RANK_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
TRAINER_SAVE_SECONDS = 90  # what the manifests' comments budget for the emergency save


@pytest.fixture(scope="module", params=sorted(EXAMPLES))
def example(request: pytest.FixtureRequest) -> tuple[str, list[Doc]]:
    directory, _ = EXAMPLES[request.param]
    return request.param, render(directory)


def _kustomizations() -> list[Path]:
    return sorted(K8S.rglob("kustomization.yaml"))


def test_every_kustomization_names_files_that_exist() -> None:
    found = _kustomizations()
    assert {p.parent for p in found} >= {K8S, K8S / "base", K8S / "multinode"}
    for path in found:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        for entry in data.get("resources", []):
            target = path.parent / entry
            assert target.is_file() or (target / "kustomization.yaml").is_file(), (
                f"{path}: resource {entry} does not exist"
            )
        for gen in data.get("configMapGenerator", []):
            for env_file in gen.get("envs", []):
                assert (path.parent / env_file).is_file(), f"{path}: envs {env_file} missing"


def test_renders_the_workload_with_its_support(example: tuple[str, list[Doc]]) -> None:
    name, docs = example
    kinds = sorted(d["kind"] for d in docs)
    workload = EXAMPLES[name][1]
    assert kinds == sorted(
        ["ServiceAccount", "ConfigMap", "PodMonitor", "PrometheusRule", workload]
    )
    images = {
        c["image"]
        for pod in pod_templates(docs)
        for c in pod.init_containers()
        if c["name"] in (SIDECAR, RESTORE)
    }
    assert images == {"registry.example.com/ckpt-sidecar:0.1.0"}, "kustomize images: not applied"


@pytest.mark.parametrize("version", VERSIONS)
def test_core_resources_pass_the_api_schema(example: tuple[str, list[Doc]], version: str) -> None:
    _, docs = example
    validated = 0
    for doc in docs:
        if doc["kind"] in CRD_KINDS:
            continue
        kubernetes_validate.validate(doc, version, strict=True)
        validated += 1
    for pod in pod_templates(docs):
        if pod.owner.startswith("JobSet/"):
            job = {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "jobset-template"},
                "spec": pod.job_spec,
            }
            kubernetes_validate.validate(job, version, strict=True)
            validated += 1
    assert validated >= 3
    assert {d["kind"] for d in docs if d["kind"] in CRD_KINDS} <= CRD_KINDS


def test_the_schema_check_rejects_a_misspelt_field() -> None:
    docs = render(K8S)
    job = copy.deepcopy(next(d for d in docs if d["kind"] == "Job"))
    job["spec"]["template"]["spec"]["initContainers"][1]["restartPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, VERSIONS[0], strict=True)


def test_restore_runs_first_then_the_native_sidecar(example: tuple[str, list[Doc]]) -> None:
    _, docs = example
    for pod in pod_templates(docs):
        inits = pod.init_containers()
        assert [c["name"] for c in inits] == [RESTORE, SIDECAR], pod.owner
        restore, sidecar = inits
        assert "restartPolicy" not in restore, "restore must run to completion before the rest"
        assert restore["args"][:1] == ["restore"]
        assert "--allow-empty" in restore["args"], "a fresh destination must not fail the pod"
        assert restore["args"][restore["args"].index("--to") + 1] == "/checkpoints"
        assert sidecar["restartPolicy"] == "Always", "native sidecar needs restartPolicy Always"
        assert sidecar["args"] == ["run"]
        assert sidecar["lifecycle"]["preStop"]["exec"]["command"] == ["ckpt-sidecar", "drain"]
        assert pod.spec["restartPolicy"] == "Never"


def test_probes_and_port_match_the_admin_listener(example: tuple[str, list[Doc]]) -> None:
    _, docs = example
    for pod in pod_templates(docs):
        sidecar = pod.by_name(SIDECAR)
        (port,) = sidecar["ports"]
        env = container_env(docs, sidecar, {RANK_FIELD: "0"}, "token")
        assert port["containerPort"] == int(env["CKPT_SIDECAR_ADMIN__PORT"])
        assert env["CKPT_SIDECAR_ADMIN__HOST"] == "0.0.0.0", "probes cannot reach 127.0.0.1"
        probes = {
            k: sidecar[k]["httpGet"] for k in ("startupProbe", "livenessProbe", "readinessProbe")
        }
        assert probes["livenessProbe"]["path"] == "/healthz"
        assert probes["startupProbe"]["path"] == "/readyz", "trainer waits for a ready sidecar"
        assert probes["readinessProbe"]["path"] == "/readyz"
        assert {p["port"] for p in probes.values()} == {port["name"]}


def test_token_comes_from_a_secret(example: tuple[str, list[Doc]]) -> None:
    _, docs = example
    for pod in pod_templates(docs):
        token = [
            e
            for e in pod.by_name(SIDECAR).get("env", [])
            if e["name"] == "CKPT_SIDECAR_ADMIN__TOKEN"
        ]
        assert len(token) == 1 and "secretKeyRef" in token[0]["valueFrom"]


def test_security_context_runs_the_image_user_read_only(example: tuple[str, list[Doc]]) -> None:
    _, docs = example
    uid, gid = dockerfile_user()
    for pod in pod_templates(docs):
        ctx = pod.spec["securityContext"]
        assert ctx["runAsNonRoot"] is True
        assert (ctx["runAsUser"], ctx["runAsGroup"]) == (uid, gid), "same UID as the image"
        assert ctx["fsGroup"] == gid, "trainer and sidecar share the volume through fsGroup"
        for name in (RESTORE, SIDECAR):
            c = pod.by_name(name)
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert set(c["resources"]) == {"requests", "limits"}
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            assert "emptyDir" in pod.volume(mounts["/tmp"]), f"{name}: /tmp must be writable"


def test_trainer_restore_and_sidecar_share_the_checkpoint_volume(
    example: tuple[str, list[Doc]],
) -> None:
    _, docs = example
    for pod in pod_templates(docs):
        seen = set()
        for name in (RESTORE, SIDECAR, TRAINER):
            c = pod.by_name(name)
            env = container_env(docs, c, {RANK_FIELD: "0"}, "token")
            watch = env.get("CKPT_SIDECAR_WATCH__PATH", "/checkpoints")
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            seen.add(mounts[watch])
        assert len(seen) == 1
        volume = pod.volume(seen.pop())
        assert "emptyDir" in volume or "ephemeral" in volume or "hostPath" in volume


def _loaded(docs: list[Doc], container: Doc, rank: str) -> Config:
    env = container_env(docs, container, {RANK_FIELD: rank}, "s3cr3t-token")
    try:
        return load(env=env)
    except ConfigError as e:  # the message names the key: show it
        pytest.fail(f"{container['name']}: the sidecar would exit 2:\n{e}")


def test_settings_load_with_the_real_config_and_fit_the_grace_period(
    example: tuple[str, list[Doc]],
) -> None:
    name, docs = example
    for pod in pod_templates(docs):
        for cname in (RESTORE, SIDECAR):
            cfg = _loaded(docs, pod.by_name(cname), rank="3")
            assert str(cfg.watch.path) == "/checkpoints"
            url = cfg.destination.url
            # Each node writes under its own prefix until a multi-node commit exists.
            assert url.endswith("/node-3" if name == "multinode" else "/node-0"), url
            grace = pod.spec["terminationGracePeriodSeconds"]
            # One countdown, spent in turn: the sidecar's SIGTERM comes after the trainer exits.
            assert TRAINER_SAVE_SECONDS + cfg.shutdown_grace_seconds <= grace, (
                "terminationGracePeriodSeconds must cover the trainer's save, then the drain"
            )
            if cname == SIDECAR:
                assert cfg.admin.token is not None
                assert cfg.admin.token.get_secret_value() == "s3cr3t-token"


def test_multinode_rank_comes_from_the_completion_index() -> None:
    docs = render(EXAMPLES["multinode"][0])
    (pod,) = pod_templates(docs)
    assert pod.job_spec["completionMode"] == "Indexed"
    for cname in (RESTORE, SIDECAR, TRAINER):
        env = {e["name"]: e for e in pod.by_name(cname).get("env", [])}
        assert env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == RANK_FIELD
    urls = {
        _loaded(docs, pod.by_name(c), rank=str(r)).destination.url
        for c in (RESTORE, SIDECAR)
        for r in range(pod.job_spec["parallelism"])
    }
    assert len(urls) == pod.job_spec["parallelism"], "every node needs its own prefix"


def test_references_resolve_within_the_render(example: tuple[str, list[Doc]]) -> None:
    _, docs = example
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for pod in pod_templates(docs):
        assert ("ServiceAccount", pod.spec["serviceAccountName"]) in names
        for c in pod.init_containers() + pod.containers():
            for source in c.get("envFrom", []):
                assert ("ConfigMap", source["configMapRef"]["name"]) in names, (
                    f"{c['name']} refers to a ConfigMap the render does not contain"
                )
            for item in c.get("env", []):
                secret = item.get("valueFrom", {}).get("secretKeyRef")
                if secret is not None:
                    assert secret.get("optional") is True, "a missing Secret must not block the pod"


def test_pod_monitor_scrapes_the_sidecar_port(example: tuple[str, list[Doc]]) -> None:
    _, docs = example
    (monitor,) = [d for d in docs if d["kind"] == "PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    selector = monitor["spec"]["selector"]["matchLabels"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    for pod in pod_templates(docs):
        labels = pod.template["metadata"]["labels"]
        assert selector.items() <= labels.items(), f"{pod.owner} is not selected"
        assert endpoint["port"] in {p["name"] for p in pod.by_name(SIDECAR)["ports"]}


def test_prometheus_rule_is_well_formed() -> None:
    docs = render(K8S)
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    groups = rule["spec"]["groups"]
    assert groups
    for group in groups:
        assert group["name"] and group["rules"]
        for r in group["rules"]:
            assert set(r) <= {"alert", "record", "expr", "for", "labels", "annotations"}
            assert r.get("alert") and "ckpt_sidecar_" in r["expr"]
            assert r["labels"]["severity"] in {"warning", "critical"}


def test_prometheus_rule_matches_the_standalone_rules() -> None:
    standalone = DEPLOY / "prometheus" / "rules.yaml"
    (rule,) = [d for d in render(K8S) if d["kind"] == "PrometheusRule"]
    groups = yaml.safe_load(standalone.read_text(encoding="utf-8"))["groups"]
    assert rule["spec"]["groups"] == groups, "keep both copies of the alerts identical"


def test_jobset_fields_the_controller_requires() -> None:
    docs = render(EXAMPLES["multinode"][0])
    (jobset,) = [d for d in docs if d["kind"] == "JobSet"]
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2"
    spec = jobset["spec"]
    assert spec["successPolicy"]["operator"] in {"All", "Any"}
    actions = {"FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts"}
    for r in spec["failurePolicy"]["rules"]:
        assert r["action"] in actions and r["name"]
    for rj in spec["replicatedJobs"]:
        assert rj["name"] and rj["template"]["spec"]["template"]["spec"]
        assert isinstance(rj.get("replicas", 1), int)
    # A preempted node fails its Job through the pod failure policy; JobSet then restarts all.
    job_rules = spec["replicatedJobs"][0]["template"]["spec"]["podFailurePolicy"]["rules"]
    assert any(
        c["type"] == "DisruptionTarget" for r in job_rules for c in r.get("onPodConditions", [])
    )
