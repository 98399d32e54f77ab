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

{{/* The node agent's labels (templates/nodeagent.yaml): its own name, so neither the
operator's Deployment nor its Service selects the agent's pods. */}}
{{- define "sailplan.nodeAgentSelectorLabels" -}}
app.kubernetes.io/name: {{ .Values.nodeAgent.name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "sailplan.nodeAgentLabels" -}}
{{ include "sailplan.nodeAgentSelectorLabels" . }}
app.kubernetes.io/part-of: sailplan
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}
