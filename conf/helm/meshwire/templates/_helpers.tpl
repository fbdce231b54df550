{{/* The name of the node agent's objects: meshwire-node for release meshwire. */}}
{{- define "meshwire.name" -}}
{{ .Release.Name }}-node
{{- end }}

{{/* The labels of every object, and the DaemonSet's selector. */}}
{{- define "meshwire.labels" -}}
app.kubernetes.io/name: meshwire
app.kubernetes.io/component: node
{{- end }}

{{/* Non-empty when the agent writes the conflist of the values (a ConfigMap). */}}
{{- define "meshwire.ownConflist" -}}
{{- if and (eq .Values.mode "conflist") .Values.conflist }}true{{ end }}
{{- end }}
