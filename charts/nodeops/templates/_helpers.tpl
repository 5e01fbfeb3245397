{{/*
Names are fixed, not prefixed with the release: the manager builds agent Jobs that run as the
ServiceAccount nodeops-agent (internal/controller/agentjob), and the ClusterRoles are cluster-wide,
so one cluster holds one nodeops release.
*/}}
{{- define "nodeops.labels" -}}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: nodeops
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* Labels of one component's objects: nodeops.labels plus app.kubernetes.io/name. */}}
{{- define "nodeops.componentLabels" -}}
app.kubernetes.io/name: {{ .name }}
{{ include "nodeops.labels" .root }}
{{- end }}

{{/* Selector labels stay as config/ has them, so the agent Job controller's label matches too. */}}
{{- define "nodeops.selectorLabels" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end }}

{{/* An image reference: repository@digest when a digest is set (it wins over the tag), else repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "nodeops.image" -}}
{{- if .digest -}}
{{ .repository }}@{{ .digest }}
{{- else -}}
{{ .repository }}:{{ .tag | default .appVersion }}
{{- end -}}
{{- end }}

{{- define "nodeops.managerImage" -}}
{{ include "nodeops.image" (merge (dict "appVersion" .Chart.AppVersion) .Values.image.manager) }}
{{- end }}

{{- define "nodeops.agentImage" -}}
{{ include "nodeops.image" (merge (dict "appVersion" .Chart.AppVersion) .Values.image.agent) }}
{{- end }}

{{/* Whether the manager serves metrics; a ServiceMonitor or PrometheusRule without them is refused. */}}
{{- define "nodeops.metricsEnabled" -}}
{{- if and (not .Values.metrics.enabled) (or .Values.metrics.serviceMonitor.enabled .Values.metrics.prometheusRule.enabled) }}
{{- fail "metrics.serviceMonitor.enabled and metrics.prometheusRule.enabled need metrics.enabled=true (the manager serves no metrics without it)" }}
{{- end }}
{{- if .Values.metrics.enabled }}true{{ end -}}
{{- end }}

{{/*
The manager keeps agent Jobs in nodeops-system, a namespace it does not take as a flag
(cmd/manager/main.go, internal/controller/agentjob), so Job mode works only there.
*/}}
{{- define "nodeops.checkNamespace" -}}
{{- if and (eq .Values.agent.mode "Job") (ne .Release.Namespace "nodeops-system") }}
{{- fail (printf "agent.mode=Job needs the release namespace nodeops-system (the manager creates agent Jobs there), not %q: install with -n nodeops-system" .Release.Namespace) }}
{{- end }}
{{- end }}
