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

{{/* Image of a deploy/Dockerfile build target; call with (dict "ctx" $ "target" "gateway"). */}}
{{- define "rsigym.image" -}}
{{- $repo := index .ctx.Values.image.repositories .target | required (printf "image.repositories has no %q" .target) -}}
{{ .ctx.Values.image.registry }}{{ $repo }}:{{ .ctx.Values.image.tag | default .ctx.Chart.AppVersion }}
{{- end }}

{{/* URL of a service inside the cluster; call with (dict "ctx" $ "name" "rollout" "port" 8701). */}}
{{- define "rsigym.serviceUrl" -}}
http://{{ include "rsigym.fullname" .ctx }}-{{ .name }}:{{ .port }}
{{- end }}

{{/* Where work that calls back (evaluation trials, sandbox doors) reaches the gateway. */}}
{{- define "rsigym.gatewayUrl" -}}
http://{{ include "rsigym.fullname" . }}-gateway:{{ .Values.gateway.service.port }}
{{- end }}

{{/* Name of the shared data volume's claim. */}}
{{- define "rsigym.dataClaim" -}}
{{- .Values.data.existingClaim | default (printf "%s-data" (include "rsigym.fullname" .)) }}
{{- end }}

{{/*
The container env of a component, from its values: `env` (plain, rendered with tpl against the
root context) and `secretEnv` (name -> an entry of .Values.secrets, read with secretKeyRef).
Call with (dict "ctx" $ "component" .Values.gateway).
*/}}
{{- define "rsigym.env" -}}
{{- $ctx := .ctx -}}
{{- range $name, $value := .component.env }}
- name: {{ $name }}
  value: {{ tpl (toString $value) $ctx | quote }}
{{- end }}
{{- range $name, $ref := .component.secretEnv }}
{{- $secret := index $ctx.Values.secrets $ref | required (printf "secrets has no entry %q (for %s)" $ref $name) }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret.name }}
      key: {{ $secret.key }}
      {{- if $secret.optional }}
      optional: true
      {{- end }}
{{- end }}
{{- end }}

{{/*
Container securityContext: the chart's, plus for sandboxing components (bubblewrap needs user
namespaces) no runtime seccomp / AppArmor profile. Call with (dict "ctx" $ "sandboxing" bool).
*/}}
{{- define "rsigym.containerSecurityContext" -}}
{{- $sc := deepCopy .ctx.Values.securityContext -}}
{{- if .sandboxing }}
{{- $_ := set $sc "seccompProfile" (dict "type" "Unconfined") }}
{{- $_ := set $sc "appArmorProfile" (dict "type" "Unconfined") }}
{{- end }}
{{- toYaml $sc }}
{{- end }}

{{/* Volumes every rsigym pod has; call with (dict "ctx" $ "dataVolume" bool). */}}
{{- define "rsigym.volumes" -}}
- name: config
  configMap:
    name: {{ include "rsigym.fullname" .ctx }}-config
- name: data
{{- if .dataVolume }}
  persistentVolumeClaim:
    claimName: {{ include "rsigym.dataClaim" .ctx }}
{{- else }}
  emptyDir: {}
{{- end }}
- {name: tmp, emptyDir: {}}
{{- end }}

{{- define "rsigym.volumeMounts" -}}
- {name: config, mountPath: /etc/rsigym, readOnly: true}
- {name: data, mountPath: /var/lib/rsigym}
- {name: tmp, mountPath: /tmp}
{{- end }}
