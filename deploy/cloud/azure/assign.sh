#!/bin/bash
# Least-privilege access for ckpt-sidecar to one Azure Blob container, plus the lifecycle policy.
# Run from the repository root after setting the variables; needs az and Owner or User Access
# Administrator on the resource group.
set -euo pipefail

SUBSCRIPTION=${SUBSCRIPTION:?set SUBSCRIPTION, the subscription id}
RESOURCE_GROUP=${RESOURCE_GROUP:?set RESOURCE_GROUP}
ACCOUNT=${ACCOUNT:?set ACCOUNT, the storage account name}
CONTAINER=${CONTAINER:-checkpoints}
# Object id of the identity the sidecar runs as (VM managed identity, or the user-assigned
# identity used by AKS workload identity).
PRINCIPAL_ID=${PRINCIPAL_ID:?set PRINCIPAL_ID, the object id of the managed identity}
# AKS workload identity only: the managed identity's name, the cluster's OIDC issuer URL and the
# namespace of the pods. Leave AKS_OIDC_ISSUER empty on VMs.
IDENTITY_NAME=${IDENTITY_NAME:-ckpt-sidecar}
AKS_OIDC_ISSUER=${AKS_OIDC_ISSUER:-}
K8S_NAMESPACE=${K8S_NAMESPACE:-default}
here=$(dirname "$0")

scope="/subscriptions/${SUBSCRIPTION}/resourceGroups/${RESOURCE_GROUP}/providers/Microsoft.Storage/storageAccounts/${ACCOUNT}/blobServices/default/containers/${CONTAINER}"

# 1. The role (edit AssignableScopes in custom-role.json to your subscription and group first).
#    The built-in "Storage Blob Data Contributor" at the same scope also works; it adds only
#    blob move and container write/delete.
az role definition create --role-definition "@${here}/custom-role.json"

# 2. Assigned at the container scope, not the account or the subscription.
az role assignment create \
    --assignee-object-id "${PRINCIPAL_ID}" \
    --assignee-principal-type ServicePrincipal \
    --role "ckpt-sidecar checkpoint writer" \
    --scope "${scope}"

# 3. AKS workload identity: trust the Kubernetes ServiceAccount ckpt-sidecar.
if [[ -n ${AKS_OIDC_ISSUER} ]]; then
    az identity federated-credential create \
        --name ckpt-sidecar \
        --identity-name "${IDENTITY_NAME}" \
        --resource-group "${RESOURCE_GROUP}" \
        --issuer "${AKS_OIDC_ISSUER}" \
        --subject "system:serviceaccount:${K8S_NAMESPACE}:ckpt-sidecar" \
        --audience api://AzureADTokenExchange
fi

# 4. Old checkpoints to Cool, then Cold (both read instantly; Archive would break restore).
#    Uncommitted blocks of abandoned uploads need no rule: Azure discards them after 7 days.
az storage account management-policy create \
    --account-name "${ACCOUNT}" \
    --resource-group "${RESOURCE_GROUP}" \
    --policy "@${here}/lifecycle-policy.json"
