{{/* The objects' name: fullnameOverride, else vk-sandbox. */}}
{{- define "vk-sandbox.fullname" -}}
{{- default "vk-sandbox" .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The Pods' selector. Fixed (a DaemonSet's selector cannot change): the same
as the kustomize base's, so an install made with manifests/ can be taken
over by the chart.
*/}}
{{- define "vk-sandbox.selectorLabels" -}}
app.kubernetes.io/name: vk-sandbox
{{- end -}}

{{/* Labels on every object's metadata (never on the Pod template). */}}
{{- define "vk-sandbox.labels" -}}
{{ include "vk-sandbox.selectorLabels" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{- define "vk-sandbox.serviceAccountName" -}}
{{- default (include "vk-sandbox.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/*
An image reference from {registry, repository, tag, digest}: dict "image"
the values, "defaultTag" the tag when .tag is "".
*/}}
{{- define "vk-sandbox.imageRef" -}}
{{- $i := .image -}}
{{- $ref := $i.repository -}}
{{- if $i.registry -}}
{{- $ref = printf "%s/%s" (trimSuffix "/" $i.registry) $i.repository -}}
{{- end -}}
{{- if $i.digest -}}
{{- printf "%s@%s" $ref $i.digest -}}
{{- else -}}
{{- printf "%s:%s" $ref (toString (default .defaultTag $i.tag)) -}}
{{- end -}}
{{- end -}}

{{/* The Secret holding the sandboxd token, and its key. */}}
{{- define "vk-sandbox.tokenSecret" -}}
{{- if .Values.sandboxd.token.value -}}
{{- printf "%s-sandboxd-token" (include "vk-sandbox.fullname" .) -}}
{{- else -}}
{{- required "sandboxd.token: set existingSecret (a Secret holding the sandboxd node token) or value (the token; the chart makes the Secret)" .Values.sandboxd.token.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "vk-sandbox.tokenKey" -}}
{{- if .Values.sandboxd.token.value -}}token{{- else -}}{{ .Values.sandboxd.token.key }}{{- end -}}
{{- end -}}

{{/*
--node-labels: the runtime label the Pod contract schedules on, then the
extra ones (sorted); a key given in node.labels overrides the default.
*/}}
{{- define "vk-sandbox.nodeLabels" -}}
{{- $l := merge (dict) .Values.node.labels (dict "sandbox.cocoonstack.io/runtime" "sandboxd") -}}
{{- $items := list -}}
{{- range $k := keys $l | sortAlpha -}}
{{- $items = append $items (printf "%s=%s" $k (toString (index $l $k))) -}}
{{- end -}}
{{- join "," $items -}}
{{- end -}}
