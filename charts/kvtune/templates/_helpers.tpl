{{/*
Names are DNS labels: Kubernetes rejects more than 63 characters, so every name is cut there
(and a trailing "-" that the cut leaves is dropped).
*/}}

{{/* The chart's name, or nameOverride. */}}
{{- define "kvtune.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The fully qualified app name: fullnameOverride, else "<release>-<name>", else the release
name alone when it already contains the chart's name (avoids "kvtune-kvtune").
*/}}
{{- define "kvtune.fullname" -}}
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

{{/* "<fullname>-<suffix>", the suffix kept whole and the fullname cut to fit 63. */}}
{{- define "kvtune.suffixedName" -}}
{{- $suffix := index . 1 -}}
{{- $max := sub 62 (len $suffix) | int -}}
{{- printf "%s-%s" (include "kvtune.fullname" (index . 0) | trunc $max | trimSuffix "-") $suffix -}}
{{- end -}}

{{- define "kvtune.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels every object carries. */}}
{{- define "kvtune.labels" -}}
helm.sh/chart: {{ include "kvtune.chart" . }}
{{ include "kvtune.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvtune
{{- end -}}

{{/* The Deployment's selector: never change these after a release exists (immutable). */}}
{{- define "kvtune.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kvtune.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "kvtune.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvtune.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The kopf peering object's name, shared by the replicas so only one is active. */}}
{{- define "kvtune.peeringName" -}}
{{- default (include "kvtune.fullname" .) .Values.peering.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvtune.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The namespaces the operator watches: the release's alone in namespaced mode. */}}
{{- define "kvtune.watchNamespaces" -}}
{{- if .Values.operator.namespaced -}}
{{- default (list .Release.Namespace) .Values.operator.watchNamespaces | join "," -}}
{{- end -}}
{{- end -}}

{{/* The namespaces where the runtime entrypoint may report (templates/runtime-access.yaml):
runtime.namespaces, else the watched namespaces in namespaced mode, else none. */}}
{{- define "kvtune.runtimeNamespaces" -}}
{{- if .Values.runtime.namespaces -}}
{{- .Values.runtime.namespaces | join "," -}}
{{- else -}}
{{- include "kvtune.watchNamespaces" . -}}
{{- end -}}
{{- end -}}

{{/*
Labels of every PodMonitor, ServiceMonitor and PrometheusRule (the chart's and, through
KVTUNE_MONITORING_LABELS, the operator's): monitoring.labels, else the `release` label a stock
kube-prometheus-stack selects on.
*/}}
{{- define "kvtune.monitoringLabels" -}}
{{- if .Values.monitoring.labels }}
{{- toYaml .Values.monitoring.labels }}
{{- else }}
release: {{ .Release.Name | quote }}
{{- end }}
{{- end }}

{{/*
The calibration Job's default image (KVTUNE_CALIBRATION_IMAGE): calibration.image, with
`{gpuClass}` left for the operator to fill in per pool; "" when the repository is empty.
*/}}
{{- define "kvtune.calibrationImage" -}}
{{- with .Values.calibration.image.repository -}}
{{- printf "%s:%s" . ($.Values.calibration.image.tag | default (printf "%s-vllm0.33.0" $.Chart.AppVersion)) -}}
{{- end -}}
{{- end }}
