{{/* The chart's name, or nameOverride. */}}
{{- define "volume-healer.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: fullnameOverride, or the release name prefixed with the chart's name
unless it holds it. */}}
{{- define "volume-healer.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "volume-healer.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "volume-healer.selectorLabels" -}}
app.kubernetes.io/name: {{ include "volume-healer.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: controller
{{- end -}}

{{- define "volume-healer.labels" -}}
{{ include "volume-healer.selectorLabels" . }}
app.kubernetes.io/part-of: volume-healer
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "volume-healer.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "volume-healer.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "volume-healer.leaderElectionNamespace" -}}
{{- default .Release.Namespace .Values.config.leaderElection.namespace -}}
{{- end -}}

{{- define "volume-healer.policyNamespace" -}}
{{- default .Release.Namespace .Values.config.policy.namespace -}}
{{- end -}}

{{/* The configuration file: config with the empty namespaces filled in. */}}
{{- define "volume-healer.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $_ := set $cfg.leaderElection "namespace" (include "volume-healer.leaderElectionNamespace" .) -}}
{{- $_ := set $cfg.policy "namespace" (include "volume-healer.policyNamespace" .) -}}
{{- $_ := set $cfg.sidecar.tls.signer "caSecret" (include "volume-healer.sidecarCASecret" .) -}}
{{- if and .Values.sidecar.enabled .Values.sidecar.serviceAccountName -}}
{{- $own := printf "system:serviceaccount:%s:%s" (include "volume-healer.sidecarNamespace" .) .Values.sidecar.serviceAccountName -}}
{{- $listed := without (splitList "," (.Values.config.sidecar.tls.signer.requesters | nospace)) "" -}}
{{- if not (has $own $listed) -}}
{{- $_ := set $cfg.sidecar.tls.signer "requesters" (append $listed $own | join ",") -}}
{{- end -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* The policy ConfigMap's label, from config.policy.labelSelector (key=value). */}}
{{- define "volume-healer.policyLabel" -}}
{{- $parts := splitn "=" 2 .Values.config.policy.labelSelector -}}
{{- if not (and $parts._1 (regexMatch "^[A-Za-z0-9./_-]+$" $parts._0) (regexMatch "^[A-Za-z0-9._-]+$" $parts._1)) -}}
{{- fail "policy.create and the policy webhook need config.policy.labelSelector of the form key=value" -}}
{{- end -}}
{{ $parts._0 }}: {{ $parts._1 | quote }}
{{- end -}}

{{- define "volume-healer.sidecarNamespace" -}}
{{- required "sidecar.namespace is required when sidecar.enabled" .Values.sidecar.namespace -}}
{{- end -}}

{{- define "volume-healer.webhookSecretName" -}}
{{- default (printf "%s-webhook-tls" (include "volume-healer.fullname" .)) .Values.webhook.certificate.secretName -}}
{{- end -}}

{{/* The name the API server calls the webhook by: the Service's DNS name in the cluster. */}}
{{- define "volume-healer.webhookHost" -}}
{{- printf "%s.%s.svc" (include "volume-healer.fullname" .) .Release.Namespace -}}
{{- end -}}

{{/* The CA Secret of the sidecars' certificates, <namespace>/<name>. */}}
{{- define "volume-healer.sidecarCASecret" -}}
{{- default (printf "%s/%s-sidecar-ca" .Release.Namespace (include "volume-healer.fullname" .)) .Values.config.sidecar.tls.signer.caSecret -}}
{{- end -}}

{{/*
"true" when the cluster can hold the sidecar's node binding: ValidatingAdmissionPolicies
(admissionregistration.k8s.io/v1, Kubernetes 1.30) and projected ServiceAccount tokens that always
name their pod's node (the node-name claim, on for good from Kubernetes 1.32). Read from Helm's
capabilities: the cluster's at install, --kube-version and --api-versions with helm template.
sidecar.nodeBinding always or never overrides what they say.
*/}}
{{- define "volume-healer.nodeBinding" -}}
{{- $mode := .Values.sidecar.nodeBinding -}}
{{- if eq $mode "always" -}}
true
{{- else if and (eq $mode "auto") (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") (semverCompare ">=1.32.0-0" .Capabilities.KubeVersion.Version) -}}
true
{{- end -}}
{{- end }}
