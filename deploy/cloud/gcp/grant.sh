#!/bin/bash
# Least-privilege access for ckpt-sidecar to one GCS bucket, plus the lifecycle rules.
# Run from the repository root after setting the variables; needs gcloud and bucket admin rights.
set -euo pipefail

PROJECT=${PROJECT:?set PROJECT, the Google Cloud project id}
BUCKET=${BUCKET:?set BUCKET, the checkpoint bucket name}
# The Google service account the sidecar runs as (on a VM: the instance's service account).
GSA=${GSA:-ckpt-sidecar@${PROJECT}.iam.gserviceaccount.com}
# GKE only: the Kubernetes namespace of the pods (ServiceAccount ckpt-sidecar, see
# deploy/kubernetes/base/serviceaccount.yaml). Leave empty on VMs.
K8S_NAMESPACE=${K8S_NAMESPACE:-}
here=$(dirname "$0")

# 1. The role: exactly the permissions the GCS backend uses (custom-role.yaml says which for what).
gcloud iam roles create ckptSidecar --project="${PROJECT}" --file="${here}/custom-role.yaml"

# 2. Bound on the bucket only, not the project. To confine it to one prefix as well, add an IAM
#    condition (needs uniform bucket-level access), e.g.
#    --condition='title=checkpoints,expression=resource.type == "storage.googleapis.com/Bucket" || resource.name.startsWith("projects/_/buckets/BUCKET/objects/runs/")'
gcloud storage buckets add-iam-policy-binding "gs://${BUCKET}" \
    --member="serviceAccount:${GSA}" \
    --role="projects/${PROJECT}/roles/ckptSidecar"

# 3. GKE Workload Identity: let the Kubernetes ServiceAccount act as the Google one.
if [[ -n ${K8S_NAMESPACE} ]]; then
    gcloud iam service-accounts add-iam-policy-binding "${GSA}" \
        --role=roles/iam.workloadIdentityUser \
        --member="serviceAccount:${PROJECT}.svc.id.goog[${K8S_NAMESPACE}/ckpt-sidecar]"
fi

# 4. Abort XML multipart uploads left behind after a day; move old checkpoints to cheaper
#    classes that still read instantly (restore keeps working).
gcloud storage buckets update "gs://${BUCKET}" --lifecycle-file="${here}/lifecycle.json"
