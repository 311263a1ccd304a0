{{/* Chart name, cut at 63 characters (DNS label limit). */}}
{{- define "envpool-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: <release>-<chart>, or <release> when it already contains the chart name.
Cut at 63 characters; suffixed names (e.g. "-metrics") cut the base further.
*/}}
{{- define "envpool-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* <fullname>-<suffix> within 63 characters. */}}
{{- define "envpool-operator.suffixed" -}}
{{- $ctx := index . 0 }}
{{- $suffix := index . 1 }}
{{- printf "%s-%s" (include "envpool-operator.fullname" $ctx | trunc (int (sub 62 (len $suffix))) | trimSuffix "-") $suffix }}
{{- end }}

{{- define "envpool-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "envpool-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "envpool-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "envpool-operator.labels" -}}
helm.sh/chart: {{ include "envpool-operator.chart" . }}
{{ include "envpool-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: envpool
{{- end }}

{{- define "envpool-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "envpool-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The one image reference: operator container and ENVPOOL_IMAGE (pool server). */}}
{{- define "envpool-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/*
Rules the operator needs in every namespace it watches, derived from
operator/envpool_operator (kopf handlers + kube.py):
- envpools list/watch (kopf), patch (kopf's progress/diff-base annotations);
  get/watch and status get because the operator grants exactly those to each
  pool server's Role (RBAC escalation check: it must hold what it grants).
- envpools/status patch: phase, conditions (kopf patch + kube.patch_envpool_status).
- children are written with server-side apply (PATCH; creating needs `create`
  too): ServiceAccount, Role, RoleBinding, NetworkPolicy, ConfigMap, RayCluster.
  Only the RayCluster is read back (get) and watched (status refresh). Nothing
  is deleted by the operator: children go through ownerReferences and the GC.
  RBAC cannot say "only objects I made" (their names are not known in advance),
  so templates/admission-policy.yaml does: those writes must carry the operator's
  label, be owned by an EnvPool and be named after it.
- events create: kopf posts warnings as core/v1 Events.
- the pool's own Redis (spec.headFaultTolerance, GCS fault tolerance): Deployment
  and Service <name>-redis by server-side apply; its password Secret <name>-redis
  is created once (`create` only: the operator never reads, lists or changes a
  Secret; 409 AlreadyExists means it is there).
No reading Secrets, no Pods, no delete, no bind/escalate.
*/}}
{{- define "envpool-operator.namespacedRules" -}}
- apiGroups: ["envpool.dev"]
  resources: ["envpools"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["envpool.dev"]
  resources: ["envpools/status"]
  verbs: ["get", "patch"]
# spec.autoscaling: the operator resizes pools the way kubectl scale and an HPA do.
- apiGroups: ["envpool.dev"]
  resources: ["envpools/scale"]
  verbs: ["get", "patch"]
- apiGroups: ["ray.io"]
  resources: ["rayclusters"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["configmaps", "serviceaccounts"]
  verbs: ["create", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["create", "patch"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create", "patch"]
# Each pool's lease API token (Secret <pool>-lease-token): created once, never read
# back (no get, list or watch: the operator sees no Secret's data), never updated; the
# garbage collector deletes it with its EnvPool.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create", "patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["create", "patch"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}
