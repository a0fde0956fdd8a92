{{/* Names and labels shared by every template. */}}

{{- define "prefixtune.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "prefixtune.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "prefixtune.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "prefixtune.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "prefixtune.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prefixtune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "prefixtune.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "prefixtune.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: prefixtune
{{- end -}}

{{- define "prefixtune.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Fail early on values the schema cannot express. */}}
{{- define "prefixtune.validate" -}}
{{- if and (eq .Values.monitoring.operatorMonitor "ServiceMonitor") .Values.monitoring.enabled (not .Values.metrics.enabled) -}}
{{- fail "monitoring.operatorMonitor=ServiceMonitor needs metrics.enabled=true (the monitor scrapes the metrics Service); use operatorMonitor: none or enable metrics" -}}
{{- end -}}
{{- if and (eq .Values.monitoring.operatorMonitor "PodMonitor") .Values.monitoring.enabled (not .Values.metrics.enabled) -}}
{{- fail "monitoring.operatorMonitor=PodMonitor needs metrics.enabled=true (the operator serves no metrics otherwise); use operatorMonitor: none or enable metrics" -}}
{{- end -}}
{{- end -}}

{{/*
The RBAC rules for namespaced objects, one list for both scopes: the ServingDeployments and their
children. Every verb here is an entry of operator/prefixtune/controller/api_calls.py (a chart test
compares the two).
*/}}
{{- define "prefixtune.namespacedRules" -}}
- apiGroups: ["prefixtune.io"]
  resources: ["servingdeployments"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["prefixtune.io"]
  resources: ["servingdeployments/status"]
  verbs: ["patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "create", "patch", "delete"]
# pods: list and watch for the operator's reads; get only so that it may grant the router's Role
# (get/list/watch pods): RBAC lets it create a Role only with rules it holds (no escalate, no bind).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
# The router in front of the engines (spec.routing): its ServiceAccount, Role and RoleBinding.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- if .Values.monitoring.enabled }}
- apiGroups: ["monitoring.coreos.com"]
  resources: ["servicemonitors"]
  verbs: ["get", "create", "patch"]
{{- end }}
{{- end -}}

{{/* Cluster-scoped reads: CRD discovery (kopf's resource scan; is the ServiceMonitor CRD installed?). */}}
{{- define "prefixtune.crdRules" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["get", "list", "watch"]
{{- end -}}

{{/* The namespaces watched with scope namespaces: watch.namespaces, or the release's namespace. A JSON list. */}}
{{- define "prefixtune.watchedNamespaces" -}}
{{- .Values.watch.namespaces | default (list .Release.Namespace) | toJson -}}
{{- end -}}
