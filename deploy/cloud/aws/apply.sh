#!/bin/bash
# Least-privilege access for ckpt-sidecar to one S3 bucket prefix, plus the lifecycle rules.
# Edit iam-policy.json first (bucket, prefix, KMS key and region; drop the KMS statement when the
# bucket does not use SSE-KMS), then run from the repository root with the aws CLI.
set -euo pipefail

BUCKET=${BUCKET:?set BUCKET, the checkpoint bucket name}
# The IAM role the sidecar runs as: the instance profile's role on EC2, or the IRSA / EKS Pod
# Identity role of the ServiceAccount ckpt-sidecar (deploy/kubernetes/base/serviceaccount.yaml).
ROLE_NAME=${ROLE_NAME:?set ROLE_NAME, the IAM role the sidecar runs as}
here=$(dirname "$0")

policy_arn=$(aws iam create-policy \
    --policy-name ckpt-sidecar \
    --policy-document "file://${here}/iam-policy.json" \
    --query Policy.Arn --output text)
aws iam attach-role-policy --role-name "${ROLE_NAME}" --policy-arn "${policy_arn}"

# Abort incomplete multipart uploads after a day; move old checkpoints to cheaper classes that
# still read instantly (restore keeps working). This replaces the bucket's lifecycle rules.
aws s3api put-bucket-lifecycle-configuration \
    --bucket "${BUCKET}" \
    --lifecycle-configuration "file://${here}/s3-lifecycle.json"
