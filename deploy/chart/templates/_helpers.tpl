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

{{/* The agent's settings file (/etc/elasticgpu/agent.env, written by the installer): agent.env of the values,
plus the installer's own pods in ELASTICGPU_AGENT_PRIVILEGED_PODS (kept beside the user's entries). The installer
is privileged and uses no claim; once kubelet talks to the agent's socket, each upgrade, reboot or restart
re-creates it through the agent, which refuses such containers on a GPU node elsewhere. The narrowest rule that
lets it through: pods of the install namespace with the installer's label (the namespace is the boundary: who
may create pods there; the label keeps the namespace's other privileged pods out), not the whole namespace. */}}
{{- define "elasticgpu.agentEnv" -}}
{{- $installer := printf "%s/app.kubernetes.io/component=agent-installer" (include "elasticgpu.namespace" .) }}
{{- $env := deepCopy (.Values.agent.env | default dict) }}
{{- $users := get $env "ELASTICGPU_AGENT_PRIVILEGED_PODS" | toString }}
{{- $_ := set $env "ELASTICGPU_AGENT_PRIVILEGED_PODS" (ternary (printf "%s,%s" $installer $users) $installer (ne $users "")) }}
{{- range $name, $value := $env }}
{{ $name }}={{ $value }}
{{- end }}
{{- end -}}
