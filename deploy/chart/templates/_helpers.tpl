{{/* The namespace of the namespaced objects: namespace.name, else the release's. */}}
{{- define "elasticgpu.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace -}}
{{- end -}}

{{/* The image of every container: repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "elasticgpu.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* A Namespace object, when namespace.create is on (the plain manifests: each file applies on its own). */}}
{{- define "elasticgpu.namespaceObject" -}}
{{- if .Values.namespace.create }}
apiVersion: v1
kind: Namespace
metadata:
  name: {{ include "elasticgpu.namespace" . }}
---
{{- end }}
{{- end -}}

{{/* The webhook's certificates come from cert-manager (else the webhook makes its own). */}}
{{- define "elasticgpu.certManager" -}}
{{- if eq .Values.webhook.certificates "cert-manager" }}true{{ else if ne .Values.webhook.certificates "self-signed" }}{{ fail (printf "webhook.certificates is %q: use self-signed or cert-manager" .Values.webhook.certificates) }}{{ end }}
{{- end -}}
