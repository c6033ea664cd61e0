{{/* Chart name, truncated to the 63 characters Kubernetes allows. */}}
{{- define "rsigym.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Release-qualified name, e.g. "prod-rsigym". */}}
{{- define "rsigym.fullname" -}}
{{- if contains .Chart.Name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "rsigym.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "rsigym.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* Selector labels of one component; call with (dict "ctx" $ "role" "gateway"). */}}
{{- define "rsigym.selectorLabels" -}}
app.kubernetes.io/name: {{ include "rsigym.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
rsigym/role: {{ .role }}
{{- end }}

{{- define "rsigym.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "rsigym.rolloutUrl" -}}
http://{{ include "rsigym.fullname" . }}-rollout:{{ .Values.rollout.port }}
{{- end }}

{{/* Where work that calls back (evaluation trials, sandbox doors) reaches the gateway. */}}
{{- define "rsigym.gatewayUrl" -}}
http://{{ include "rsigym.fullname" . }}-gateway:{{ .Values.gateway.port }}
{{- end }}
