"""deploy/cloud: the IAM policies grant every call the backends make, on the right resource, and
nothing more; the lifecycle rules abort stale multipart uploads after a day and tier old
checkpoints only to classes that still read instantly (so restore keeps working).

The S3 lifecycle file is validated against botocore's own model of
PutBucketLifecycleConfiguration. IAM documents have no schema beyond JSON; the GCS and Azure
lifecycle formats are checked against the action and condition names their documentation lists.
"""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

import botocore.session
import pytest
import yaml
from botocore.validate import ParamValidator

from tests.deploy.tools import DEPLOY, run, tool

CLOUD = DEPLOY / "cloud"
BUCKET_ARN = "arn:aws:s3:::my-training-bucket"
OBJECT_ARN = "arn:aws:s3:::my-training-bucket/runs/run-1/node-0/step_1.pt"

# Every S3 API the S3 backend calls -> the IAM actions it needs and on what resource.
S3_CALLS: dict[str, list[tuple[str, str]]] = {
    "PutObject": [("s3:PutObject", OBJECT_ARN)],
    "GetObject": [("s3:GetObject", OBJECT_ARN)],
    "HeadObject": [("s3:GetObject", OBJECT_ARN)],
    "ListObjectsV2": [("s3:ListBucket", BUCKET_ARN)],
    "DeleteObject": [("s3:DeleteObject", OBJECT_ARN)],
    "CreateMultipartUpload": [("s3:PutObject", OBJECT_ARN)],
    "UploadPart": [("s3:PutObject", OBJECT_ARN)],
    "CompleteMultipartUpload": [("s3:PutObject", OBJECT_ARN)],
    "AbortMultipartUpload": [("s3:AbortMultipartUpload", OBJECT_ARN)],
    "ListMultipartUploads": [("s3:ListBucketMultipartUploads", BUCKET_ARN)],
    "CopyObject": [("s3:GetObject", OBJECT_ARN), ("s3:PutObject", OBJECT_ARN)],
    "UploadPartCopy": [("s3:GetObject", OBJECT_ARN), ("s3:PutObject", OBJECT_ARN)],
    "GetBucketLocation": [("s3:GetBucketLocation", BUCKET_ARN)],
}
KMS_ACTIONS = {"kms:GenerateDataKey", "kms:Decrypt"}
GCS_PERMISSIONS = {
    "storage.objects.create",
    "storage.objects.get",
    "storage.objects.list",
    "storage.objects.delete",
    "storage.buckets.get",
}
GCS_XML_MULTIPART = {
    "storage.multipartUploads.create",
    "storage.multipartUploads.abort",
    "storage.multipartUploads.list",
}
AZ_BLOBS = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs"
INSTANT_S3_CLASSES = {"STANDARD_IA", "ONEZONE_IA", "INTELLIGENT_TIERING", "GLACIER_IR"}


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _as_list(v: str | list[str]) -> list[str]:
    return [v] if isinstance(v, str) else list(v)


def _allowed(policy: dict[str, Any], action: str, resource: str) -> bool:
    for st in policy["Statement"]:
        if st["Effect"] != "Allow":
            continue
        if action in _as_list(st["Action"]) and any(
            fnmatch.fnmatchcase(resource, r) for r in _as_list(st["Resource"])
        ):
            return True
    return False


def test_aws_policy_grants_every_s3_call_on_its_resource() -> None:
    policy = _json(CLOUD / "aws" / "iam-policy.json")
    assert policy["Version"] == "2012-10-17"
    missing = [
        f"{api} needs {action} on {resource}"
        for api, needs in S3_CALLS.items()
        for action, resource in needs
        if not _allowed(policy, action, resource)
    ]
    assert not missing, missing


def test_aws_policy_grants_nothing_more() -> None:
    policy = _json(CLOUD / "aws" / "iam-policy.json")
    needed = {a for needs in S3_CALLS.values() for a, _ in needs} | KMS_ACTIONS
    granted: set[str] = set()
    for st in policy["Statement"]:
        actions = _as_list(st["Action"])
        granted.update(actions)
        assert not any("*" in a for a in actions), f"wildcard action in {st['Sid']}"
        assert "*" not in _as_list(st["Resource"]), f"Resource * in {st['Sid']}"
        assert "NotAction" not in st and "NotResource" not in st
    assert granted == needed
    # Object actions are confined to the prefix, not the whole bucket.
    assert not _allowed(policy, "s3:DeleteObject", f"{BUCKET_ARN}/other-team/x")
    listing = next(s for s in policy["Statement"] if "s3:ListBucket" in _as_list(s["Action"]))
    assert listing["Condition"]["StringLike"]["s3:prefix"]


def test_aws_kms_is_usable_only_through_s3() -> None:
    policy = _json(CLOUD / "aws" / "iam-policy.json")
    (kms,) = [s for s in policy["Statement"] if set(_as_list(s["Action"])) == KMS_ACTIONS]
    assert _as_list(kms["Resource"])[0].startswith("arn:aws:kms:")
    assert kms["Condition"]["StringEquals"]["kms:ViaService"].startswith("s3.")


def test_s3_lifecycle_is_a_valid_put_bucket_lifecycle_configuration() -> None:
    config = _json(CLOUD / "aws" / "s3-lifecycle.json")
    model = botocore.session.get_session().get_service_model("s3")
    shape = model.operation_model("PutBucketLifecycleConfiguration").input_shape
    report = ParamValidator().validate(
        {"Bucket": "my-training-bucket", "LifecycleConfiguration": config}, shape
    )
    assert not report.has_errors(), report.generate_report()
    # botocore checks names, types and required members, not enum values: check those here.
    enums = {
        "Status": model.shape_for("ExpirationStatus").enum,
        "StorageClass": model.shape_for("TransitionStorageClass").enum,
    }
    for rule in config["Rules"]:
        assert rule["Status"] in enums["Status"]
        for t in rule.get("Transitions", []):
            assert t["StorageClass"] in enums["StorageClass"]
    typo = {"Rules": [{"Status": "Enabled", "Filter": {}, "AbortIncompleteMultipartUploads": {}}]}
    bad = ParamValidator().validate({"Bucket": "b", "LifecycleConfiguration": typo}, shape)
    assert bad.has_errors(), "the validator must reject a misspelt member"


def test_s3_lifecycle_aborts_after_a_day_and_keeps_restore_instant() -> None:
    rules = _json(CLOUD / "aws" / "s3-lifecycle.json")["Rules"]
    aborts = [
        r["AbortIncompleteMultipartUpload"]["DaysAfterInitiation"]
        for r in rules
        if "AbortIncompleteMultipartUpload" in r
    ]
    assert aborts == [1]
    classes = {t["StorageClass"] for r in rules for t in r.get("Transitions", [])}
    assert classes and classes <= INSTANT_S3_CLASSES, "GLACIER/DEEP_ARCHIVE would break restore"
    assert all(r["Status"] == "Enabled" for r in rules)


def test_gcp_role_has_exactly_the_backend_permissions() -> None:
    role = yaml.safe_load((CLOUD / "gcp" / "custom-role.yaml").read_text(encoding="utf-8"))
    perms = set(role["includedPermissions"])
    assert perms >= GCS_PERMISSIONS
    assert perms - GCS_PERMISSIONS <= GCS_XML_MULTIPART
    assert role["stage"] == "GA" and role["title"]


def test_gcs_lifecycle_aborts_after_a_day_and_keeps_restore_instant() -> None:
    rules = _json(CLOUD / "gcp" / "lifecycle.json")["rule"]
    conditions = {
        "age",
        "matchesPrefix",
        "matchesStorageClass",
        "matchesSuffix",
        "createdBefore",
        "isLive",
        "numNewerVersions",
        "daysSinceNoncurrentTime",
    }
    for r in rules:
        assert r["action"]["type"] in {
            "Delete",
            "SetStorageClass",
            "AbortIncompleteMultipartUpload",
        }
        assert set(r["condition"]) <= conditions
    aborts = [
        r["condition"]["age"]
        for r in rules
        if r["action"]["type"] == "AbortIncompleteMultipartUpload"
    ]
    assert aborts == [1]
    classes = {
        r["action"]["storageClass"] for r in rules if r["action"]["type"] == "SetStorageClass"
    }
    assert classes and classes <= {"NEARLINE", "COLDLINE"}


def test_azure_role_reads_writes_deletes_lists_blobs_only() -> None:
    role = _json(CLOUD / "azure" / "custom-role.json")
    data = set(role["DataActions"])
    assert {f"{AZ_BLOBS}/read", f"{AZ_BLOBS}/write", f"{AZ_BLOBS}/delete"} <= data
    assert data <= {f"{AZ_BLOBS}/{a}" for a in ("read", "write", "delete", "add/action")}
    assert all("*" not in a for a in role["Actions"] + role["DataActions"])
    assert role["IsCustom"] is True
    for scope in role["AssignableScopes"]:  # custom roles: subscription or group, not a resource
        assert "/providers/" not in scope


def test_azure_lifecycle_never_archives() -> None:
    rules = _json(CLOUD / "azure" / "lifecycle-policy.json")["rules"]
    for r in rules:
        assert r["type"] == "Lifecycle" and r["enabled"] is True
        actions = r["definition"]["actions"]["baseBlob"]
        assert set(actions) <= {"tierToCool", "tierToCold", "delete"}, "Archive blocks restore"
        assert r["definition"]["filters"]["blobTypes"] == ["blockBlob"]


@pytest.mark.parametrize("script", ["aws/apply.sh", "gcp/grant.sh", "azure/assign.sh"])
def test_setup_scripts_pass_shellcheck(script: str) -> None:
    proc = run([tool("shellcheck"), "--severity=style", str(CLOUD / script)])
    assert proc.returncode == 0, proc.stdout
