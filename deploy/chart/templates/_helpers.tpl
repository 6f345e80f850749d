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

{{/* The node hook (agent.nodeHook): nri or cri-proxy; anything else fails the render naming both. */}}
{{- define "elasticgpu.nodeHook" -}}
{{- $hook := .Values.agent.nodeHook | toString }}
{{- if or (eq $hook "nri") (eq $hook "cri-proxy") }}{{ $hook }}{{ else }}{{ fail (printf "agent.nodeHook is %q: use nri (the agent as a DaemonSet pod, hooked into the runtime through NRI) or cri-proxy (a host service and kubelet's runtime endpoint on its CRI proxy)" $hook) }}{{ end }}
{{- end -}}

{{/* The agent's settings (ELASTICGPU_AGENT_* lines): agent.env of the values, plus the chart's own pods in
ELASTICGPU_AGENT_PRIVILEGED_PODS (kept beside the user's entries). With cri-proxy they are /etc/elasticgpu/agent.env,
written by the installer, which is privileged and uses no claim: once kubelet talks to the agent's socket, each
upgrade, reboot or restart re-creates it through the agent, which refuses such containers on a GPU node elsewhere.
With nri they are the agent container's environment, and the agent's own pods are the ones let through (NRI
creates them untouched while no agent is connected, but a second plugin process, or a future runtime that waits for
its plugins, would judge them). The narrowest rule that lets the chart's pod through: pods of the install namespace
with its component label (the namespace is the boundary: who may create pods there; the label keeps the namespace's
other privileged pods out), not the whole namespace. */}}
{{- define "elasticgpu.agentEnv" -}}
{{- $component := ternary "agent" "agent-installer" (eq (include "elasticgpu.nodeHook" .) "nri") }}
{{- $own := printf "%s/app.kubernetes.io/component=%s" (include "elasticgpu.namespace" .) $component }}
{{- if and (eq $component "agent") .Values.agent.mps.enabled }}
{{- /* elasticgpu-mps is privileged too and uses no claim: exempt from --refuse-privileged as the agent is */}}
{{- $own = printf "%s,%s/app.kubernetes.io/component=mps" $own (include "elasticgpu.namespace" .) }}
{{- end }}
{{- $env := deepCopy (.Values.agent.env | default dict) }}
{{- $users := get $env "ELASTICGPU_AGENT_PRIVILEGED_PODS" | toString }}
{{- $_ := set $env "ELASTICGPU_AGENT_PRIVILEGED_PODS" (ternary (printf "%s,%s" $own $users) $own (ne $users "")) }}
{{- range $name, $value := $env }}
{{ $name }}={{ $value }}
{{- end }}
{{- end -}}
