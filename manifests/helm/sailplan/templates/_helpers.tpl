{{/* Labels on every object; the selector keeps to the stable ones. */}}
{{- define "sailplan.selectorLabels" -}}
app.kubernetes.io/name: {{ .Values.name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sailplan.labels" -}}
{{ include "sailplan.selectorLabels" . }}
app.kubernetes.io/part-of: sailplan
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}
