{{/* The chart's name, or nameOverride. */}}
{{- define "healer-refdriver.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: fullnameOverride, or the release name prefixed with the chart's name
unless it holds it. */}}
{{- define "healer-refdriver.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "healer-refdriver.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "healer-refdriver.labels" -}}
app.kubernetes.io/name: {{ include "healer-refdriver.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: volume-healer
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* Selector labels of a component's pods; call with (list $ "component"). */}}
{{- define "healer-refdriver.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "healer-refdriver.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* An image reference; call with (list $ .Values.images.<name> defaultTag). */}}
{{- define "healer-refdriver.image" -}}
{{- $root := index . 0 -}}
{{- $img := index . 1 -}}
{{- $default := index . 2 -}}
{{- if not $img.repository }}{{ fail "every image needs a repository (images.<name>.repository)" }}{{ end -}}
{{- if $img.digest -}}
{{- printf "%s@%s" $img.repository $img.digest -}}
{{- else -}}
{{- $tag := default $default $img.tag -}}
{{- if not $tag }}{{ fail (printf "image %s needs a tag or a digest" $img.repository) }}{{ end -}}
{{- printf "%s:%s" $img.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The folder of the driver's sockets on the node: kubelet dials the CSI socket there. */}}
{{- define "healer-refdriver.pluginDir" -}}
{{- printf "%s/plugins/%s" (trimSuffix "/" .Values.kubeletDir) .Values.driverName -}}
{{- end -}}

{{- define "healer-refdriver.registrationDir" -}}
{{- printf "%s/plugins_registry" (trimSuffix "/" .Values.kubeletDir) -}}
{{- end -}}

{{/* Runs as root, the owner of the state folder and of the driver's sockets, with no capability. */}}
{{- define "healer-refdriver.rootNoCaps" -}}
runAsUser: 0
runAsGroup: 0
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

