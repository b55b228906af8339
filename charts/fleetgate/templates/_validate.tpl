{{/*
Invalid combinations of values, checked before anything is rendered. Each message says what is wrong
and how to fix it; values.schema.json catches wrong types and unknown keys before this runs.
*/}}
{{- define "fleetgate.validate" -}}
{{- $v := .Values }}
{{- if and $v.redis.enabled $v.redis.externalUrl }}
{{- fail "redis.enabled=true and redis.externalUrl are both set: use the bundled Redis (clear redis.externalUrl) or an external one (set redis.enabled=false)" }}
{{- end }}
{{- $hasRedis := or $v.redis.enabled $v.redis.externalUrl }}
{{- if $v.epp.enabled }}
{{- if and (gt (int $v.epp.replicas) 1) (not $hasRedis) }}
{{- fail (printf "epp.replicas is %d but no Redis is configured: Endpoint Picker replicas must share routing state, limits and budgets; set redis.enabled=true or redis.externalUrl, or run one replica" (int $v.epp.replicas)) }}
{{- end }}
{{- $poolNs := include "fleetgate.gateway.namespace" . }}
{{- if and $v.epp.publishPools (ne $poolNs .Release.Namespace) }}
{{- fail (printf "epp.publishPools: the InferencePools live in namespace %q but the Endpoint Picker Service in %q, and an InferencePool's endpointPickerRef cannot name a Service in another namespace; install the release in %q, or set epp.publishPools=false and publish pools yourself" $poolNs .Release.Namespace $poolNs) }}
{{- end }}
{{- if and $v.epp.publishPools (not $v.operator.enabled) }}
{{- fail "epp.publishPools=true needs the operator (operator.enabled=true), which publishes the InferencePools; or set epp.publishPools=false and create the pools yourself" }}
{{- end }}
{{- end }}
{{- if or $v.gateway.enabled $v.epp.enabled }}
{{- $as := $v.gateway.autoscaling }}
{{- if and $as.enabled (gt (int $as.minReplicas) (int $as.maxReplicas)) }}
{{- fail (printf "gateway.autoscaling.minReplicas (%d) is greater than gateway.autoscaling.maxReplicas (%d)" (int $as.minReplicas) (int $as.maxReplicas)) }}
{{- end }}
{{- $most := ternary (int $as.maxReplicas) (int $v.gateway.replicas) $as.enabled }}
{{- if and $v.gateway.enabled (gt $most 1) (not $hasRedis) }}
{{- fail (printf "the gateway can run %d replicas but no Redis is configured: replicas must share caches, rate limits and budgets; set redis.enabled=true or redis.externalUrl, or run one replica (gateway.replicas=1, autoscaling off)" $most) }}
{{- end }}
{{- $server := $v.gateway.config.server | default dict }}
{{- range $key, $instead := dict "host" "(the chart listens on every pod address)" "port" "gateway.port" "metrics_port" "gateway.metricsPort" "metrics_host" "(metrics listen on every pod address)" "log_level" "gateway.logLevel" "drain_s" "gateway.drainSeconds" }}
{{- if hasKey $server $key }}
{{- fail (printf "gateway.config.server.%s is set by the chart: use %s instead" $key $instead) }}
{{- end }}
{{- end }}
{{- $close := $server.drain_close_s | default 3 | float64 }}
{{- /* the settle writes get server.settle_s (4 s by default) in all; 1 s more for the process to exit */}}
{{- $settle := addf ($server.settle_s | default 4 | float64) 1 }}
{{- $needed := addf (int $v.gateway.preStopSeconds) (int $v.gateway.drainSeconds) $close $settle }}
{{- if lt (float64 (int $v.gateway.terminationGracePeriodSeconds)) $needed }}
{{- fail (printf "gateway.terminationGracePeriodSeconds (%d) is shorter than a gateway pod's shutdown: preStopSeconds (%d) + drainSeconds (%d) + gateway.config.server.drain_close_s (%v) + gateway.config.server.settle_s + 1 s to exit (%v s) = %v s; the kubelet would kill streams before they are recorded and billed. Raise terminationGracePeriodSeconds or lower drainSeconds" (int $v.gateway.terminationGracePeriodSeconds) (int $v.gateway.preStopSeconds) (int $v.gateway.drainSeconds) $close $settle $needed) }}
{{- end }}
{{- $keys := $v.gateway.apiKeys }}
{{- if and $keys.existingSecret (or $keys.adminKeyHashes $keys.tenants) }}
{{- fail "gateway.apiKeys.existingSecret is set together with gateway.apiKeys.adminKeyHashes/tenants: keep the hashes in the existing Secret, or let the chart create one from the values" }}
{{- end }}
{{- /* `helm upgrade -f my-values.yaml` without the key hashes would delete the keys Secret of the release
while the gateway stays on auth: api_key, and every client would get 401. lookup is empty under
`helm template` and on a first install, so this only ever refuses such an upgrade. */ -}}
{{- if and (eq (include "fleetgate.gateway.authMode" .) "api_key") (not (include "fleetgate.gateway.keysSecret" .)) }}
{{- $keysName := include "fleetgate.componentName" (dict "root" . "component" "gateway-keys") }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $keysName }}
{{- if $existing }}
{{- fail (printf "gateway.apiKeys has no adminKeyHashes, tenants or existingSecret, but this release's keys Secret %s/%s exists and the gateway uses auth: api_key: this upgrade would delete the keys and every client would get 401. Pass the hashes again (e.g. --set-json 'gateway.apiKeys.adminKeyHashes=[\"sha256:...\"]', or keep them in my-values.yaml), or use --reuse-values, or set gateway.config.server.auth=open on purpose" .Release.Namespace $keysName) }}
{{- end }}
{{- end }}
{{- $known := list }}
{{- range (default list ($v.gateway.config.tenancy).tenants) }}
{{- $known = append $known .id }}
{{- end }}
{{- range $tenant, $_ := $keys.tenants }}
{{- if not (has $tenant $known) }}
{{- fail (printf "gateway.apiKeys.tenants has keys for tenant %q, which is not in gateway.config.tenancy.tenants (known: %s)" $tenant (join ", " $known | default "none")) }}
{{- end }}
{{- end }}
{{- end }}
{{- if and $v.operator.watchAllNamespaces $v.operator.watchNamespaces }}
{{- fail "operator.watchAllNamespaces=true and operator.watchNamespaces are both set: pick one" }}
{{- end }}
{{- end }}
