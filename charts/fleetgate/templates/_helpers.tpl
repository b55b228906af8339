{{/*
Names. Kubernetes names and label values are limited to 63 characters (DNS-1123 labels), so every
generated name is truncated and stripped of a trailing dash. Component suffixes are added before the
truncation, so a long release name can never push a suffix past the limit.
*/}}

{{- define "fleetgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "fleetgate.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "fleetgate.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Name of one component's objects: "<fullname>-<component>", at most 63 characters. */}}
{{- define "fleetgate.componentName" -}}
{{- $full := include "fleetgate.fullname" .root }}
{{- $suffix := printf "-%s" .component }}
{{- printf "%s%s" ($full | trunc (int (sub 63 (len $suffix))) | trimSuffix "-") $suffix }}
{{- end }}

{{- define "fleetgate.labels" -}}
helm.sh/chart: {{ include "fleetgate.chart" . }}
{{ include "fleetgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: fleetgate
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "fleetgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "fleetgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels and selector labels of one component: call with (dict "root" $ "component" "gateway"). */}}
{{- define "fleetgate.componentLabels" -}}
{{ include "fleetgate.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "fleetgate.componentSelectorLabels" -}}
{{ include "fleetgate.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The control-plane image (operator and gateway share it). */}}
{{- define "fleetgate.image" -}}
{{- $img := .Values.image }}
{{- if $img.digest }}
{{- printf "%s@%s" $img.repository $img.digest }}
{{- else }}
{{- printf "%s:%s" $img.repository (default .Chart.AppVersion $img.tag) }}
{{- end }}
{{- end }}

{{- define "fleetgate.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create }}
{{- default (include "fleetgate.componentName" (dict "root" . "component" "operator")) .Values.operator.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.operator.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "fleetgate.gateway.serviceAccountName" -}}
{{- if .Values.gateway.serviceAccount.create }}
{{- default (include "fleetgate.componentName" (dict "root" . "component" "gateway")) .Values.gateway.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.gateway.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
Password of the bundled Redis: redis.auth.password, else the one in the chart's Secret from an earlier
install (`lookup`; empty under `helm template`), else a fresh random one. Stored back into the values,
so every template of one render sees the same password.
*/}}
{{- define "fleetgate.redis.password" -}}
{{- $auth := .Values.redis.auth }}
{{- if not $auth.password }}
{{- $name := include "fleetgate.componentName" (dict "root" . "component" "redis") }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $name }}
{{- if and $existing $existing.data (hasKey $existing.data "redis-password") }}
{{- $_ := set $auth "password" (index $existing.data "redis-password" | b64dec) }}
{{- else }}
{{- $_ := set $auth "password" (randAlphaNum 32) }}
{{- end }}
{{- end }}
{{- $auth.password }}
{{- end }}

{{/* Redis URL the gateway uses: the bundled StatefulSet's Service, the external URL, or "" (none). */}}
{{- define "fleetgate.redisUrl" -}}
{{- if .Values.redis.enabled }}
{{- $host := printf "%s.%s.svc:%d" (include "fleetgate.componentName" (dict "root" . "component" "redis")) .Release.Namespace (int .Values.redis.port) }}
{{- if .Values.redis.auth.enabled }}
{{- /* urlquery writes a space as "+", which URL userinfo would read literally: use %20 (a real "+" is %2B). */ -}}
{{- printf "redis://:%s@%s/0" (include "fleetgate.redis.password" . | urlquery | replace "+" "%20") $host }}
{{- else }}
{{- printf "redis://%s/0" $host }}
{{- end }}
{{- else if .Values.redis.externalUrl }}
{{- .Values.redis.externalUrl }}
{{- end }}
{{- end }}

{{/* "true" when gateway.yaml holds a credential (a Redis password) and so must live in a Secret. */}}
{{- define "fleetgate.gateway.configIsSecret" -}}
{{- if contains "@" (include "fleetgate.redisUrl" .) }}true{{ end }}
{{- end }}

{{/* Namespaces the operator watches: the listed ones, or the release namespace when the list is empty
and watchAllNamespaces is false. */}}
{{- define "fleetgate.operator.namespaces" -}}
{{- if .Values.operator.watchAllNamespaces }}
{{- list | toJson }}
{{- else if .Values.operator.watchNamespaces }}
{{- .Values.operator.watchNamespaces | uniq | toJson }}
{{- else }}
{{- list .Release.Namespace | toJson }}
{{- end }}
{{- end }}

{{/* The one namespace whose engine pods the gateway discovers. */}}
{{- define "fleetgate.gateway.namespace" -}}
{{- if .Values.gateway.discovery.namespace }}
{{- .Values.gateway.discovery.namespace }}
{{- else if and .Values.operator.watchNamespaces (not .Values.operator.watchAllNamespaces) }}
{{- first .Values.operator.watchNamespaces }}
{{- else }}
{{- .Release.Namespace }}
{{- end }}
{{- end }}

{{/* Pod security shared by every container the chart runs. */}}
{{- define "fleetgate.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/* Name of the Secret holding the hashed API key file ("" when the chart mounts no key file). */}}
{{- define "fleetgate.gateway.keysSecret" -}}
{{- $keys := .Values.gateway.apiKeys }}
{{- if $keys.existingSecret }}
{{- $keys.existingSecret }}
{{- else if or $keys.adminKeyHashes $keys.tenants }}
{{- include "fleetgate.componentName" (dict "root" . "component" "gateway-keys") }}
{{- end }}
{{- end }}

{{/* The key file the chart puts into its Secret: the shape of fleetgate.gateway.tenancy.config.KeysFile. */}}
{{- define "fleetgate.gateway.keysFile" -}}
{{- $keys := .Values.gateway.apiKeys }}
{{- toYaml (dict "admin_key_hashes" $keys.adminKeyHashes "tenants" $keys.tenants) }}
{{- end }}

{{/*
The gateway's configuration file (gateway.yaml): the user's non-empty sections from gateway.config,
plus what only the chart knows: where to listen, how to discover engines, the Redis URL and the path
of the mounted key file.
*/}}
{{- define "fleetgate.gateway.config" -}}
{{- $gw := .Values.gateway }}
{{- $cfg := dict }}
{{- range $key, $section := $gw.config }}
{{- if $section }}
{{- $_ := set $cfg $key (deepCopy $section) }}
{{- end }}
{{- end }}
{{- $server := deepCopy (default dict $cfg.server) }}
{{- $_ := set $server "host" "0.0.0.0" }}
{{- $_ := set $server "port" (int $gw.port) }}
{{- $_ := set $server "metrics_port" (int $gw.metricsPort) }}
{{- $_ := set $server "log_level" $gw.logLevel }}
{{- $_ := set $server "drain_s" (int $gw.drainSeconds) }}
{{- /* Secure by default in a cluster: API keys are required unless the values say auth: open. */ -}}
{{- if not (hasKey $server "auth") }}
{{- $_ := set $server "auth" "api_key" }}
{{- end }}
{{- $_ := set $cfg "server" $server }}
{{- $_ := set $cfg "discovery" (dict "kind" "kubernetes" "namespace" (include "fleetgate.gateway.namespace" .) "label_selector" $gw.discovery.labelSelector) }}
{{- $redis := include "fleetgate.redisUrl" . }}
{{- if $redis }}
{{- $_ := set $cfg "redis_url" $redis }}
{{- end }}
{{- with $gw.cacheEncoder }}
{{- if .model }}
{{- $cache := deepCopy (default dict $cfg.cache) }}
{{- $semantic := deepCopy (default dict $cache.semantic) }}
{{- $remote := deepCopy (default dict $semantic.remote) }}
{{- $_ := set $remote "model" .model }}
{{- $_ := set $remote "timeout_ms" .timeoutMs }}
{{- if .url }}
{{- $_ := set $remote "url" .url }}
{{- end }}
{{- $_ := set $semantic "embedder" "remote" }}
{{- $_ := set $semantic "remote" $remote }}
{{- $_ := set $cache "semantic" $semantic }}
{{- $_ := set $cfg "cache" $cache }}
{{- end }}
{{- end }}
{{- if include "fleetgate.gateway.keysSecret" . }}
{{- $tenancy := deepCopy (default dict $cfg.tenancy) }}
{{- $_ := set $tenancy "keys_file" "/etc/fleetgate/keys/keys.yaml" }}
{{- $_ := set $cfg "tenancy" $tenancy }}
{{- end }}
{{- toYaml $cfg }}
{{- end }}

{{/* The gateway's auth mode as gateway.yaml will say it: api_key unless gateway.config.server.auth says otherwise. */}}
{{- define "fleetgate.gateway.authMode" -}}
{{- $server := .Values.gateway.config.server | default dict }}
{{- default "api_key" $server.auth }}
{{- end }}

{{- define "fleetgate.epp.serviceAccountName" -}}
{{- if .Values.epp.serviceAccount.create }}
{{- default (include "fleetgate.componentName" (dict "root" . "component" "epp")) .Values.epp.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.epp.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The Endpoint Picker's configuration: the gateway's (the same stages: tenants, keys, limits, cache, tiers,
routing, Redis), with the picker's own listener and InferencePool discovery in the namespace the engines
run in. Two front doors, one pipeline: gateway.config and gateway.apiKeys configure both.
*/}}
{{- define "fleetgate.epp.config" -}}
{{- $epp := .Values.epp }}
{{- $cfg := include "fleetgate.gateway.config" . | fromYaml }}
{{- $server := $cfg.server }}
{{- $_ := set $server "metrics_port" (int $epp.metricsPort) }}
{{- $_ := set $server "log_level" $epp.logLevel }}
{{- $discovery := dict "kind" "inferencepool" "namespace" (include "fleetgate.gateway.namespace" .) }}
{{- with $epp.pool }}
{{- $_ := set $discovery "pool" . }}
{{- end }}
{{- $_ := set $cfg "discovery" $discovery }}
{{- $_ := set $cfg "epp" (dict "host" "0.0.0.0" "port" (int $epp.port) "max_endpoints" (int $epp.maxEndpoints)) }}
{{- toYaml $cfg }}
{{- end }}

{{/* The Endpoint Picker's Service: what every published InferencePool's endpointPickerRef names. */}}
{{- define "fleetgate.epp.serviceName" -}}
{{- include "fleetgate.componentName" (dict "root" . "component" "epp") }}
{{- end }}

{{/* The Kopf peering object's name. */}}
{{- define "fleetgate.operator.peeringName" -}}
{{- .Values.operator.peering.name }}
{{- end }}
