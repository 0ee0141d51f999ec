{{/*
Names are fixed, as config/default's are: the manager watches every namespace,
so one release per cluster; the sample QuotaPlane's
spec.enforcer.deploymentName names quotaplane-enforcer; the NetworkPolicies
select the pods by these names.
*/}}

{{/* The labels every object of the chart carries, besides its own. */}}
{{- define "quotaplane.labels" -}}
app.kubernetes.io/part-of: quotaplane
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* host:port of Redis: redis.address, else the trial Redis. */}}
{{- define "quotaplane.redisAddress" -}}
{{- if .Values.redis.address -}}
{{- .Values.redis.address -}}
{{- else if .Values.redis.trial.enabled -}}
quotaplane-redis:6379
{{- else -}}
{{- fail "redis.address is empty and redis.trial.enabled is false: set redis.address to your Redis's host:port" -}}
{{- end -}}
{{- end }}

{{/* The env var that carries Redis's password from redis.passwordSecret. */}}
{{- define "quotaplane.redisPasswordEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ required "redis.passwordSecret.name is required" .secret.name }}
      key: {{ required "redis.passwordSecret.key is required" .secret.key }}
      optional: {{ .secret.optional }}
{{- end }}

{{/*
90% of a memory quantity, in bytes: the GOMEMLIMIT that goes with a
container's memory limit, the share the enforcer keeps itself
(QUOTAPLANE_MEMORY_LIMIT). The Go runtime then collects harder before the
kernel kills the container. Whole numbers with a suffix of k, M, G, T, Ki,
Mi, Gi or Ti, or plain bytes.
*/}}
{{- define "quotaplane.goMemLimit" -}}
{{- $q := . -}}
{{- if kindIs "float64" $q -}}{{- $q = int64 $q -}}{{- end -}}
{{- $q = toString $q -}}
{{- $digits := regexFind "^[0-9]+" $q -}}
{{- $unit := trimPrefix $digits $q -}}
{{- $bytes := dict "" 1 "k" 1000 "M" 1000000 "G" 1000000000 "T" 1000000000000 "Ki" 1024 "Mi" 1048576 "Gi" 1073741824 "Ti" 1099511627776 -}}
{{- if or (not $digits) (not (hasKey $bytes $unit)) -}}
{{- fail (printf "memory limit %q: write a whole number of bytes, or of k, M, G, T, Ki, Mi, Gi or Ti (e.g. 256Mi)" $q) -}}
{{- end -}}
{{- mul (div (mul (atoi $digits) (get $bytes $unit)) 10) 9 -}}
{{- end }}

{{/*
The Redis login of a component (dict "root" $ "component" "manager" or
"enforcer"): its ACL user and that user's password key with
redis.aclUsers.enabled, else the default user's password.
*/}}
{{- define "quotaplane.redisLoginEnv" -}}
{{- $redis := .root.Values.redis -}}
{{- if $redis.aclUsers.enabled -}}
- name: QUOTAPLANE_REDIS_USERNAME
  value: quotaplane-{{ .component }}
{{ include "quotaplane.redisPasswordEnv" (dict "name" "QUOTAPLANE_REDIS_PASSWORD" "secret" (dict "name" $redis.passwordSecret.name "key" (index $redis.aclUsers (printf "%sPasswordKey" .component)) "optional" $redis.passwordSecret.optional)) }}
{{- else -}}
{{ include "quotaplane.redisPasswordEnv" (dict "name" "QUOTAPLANE_REDIS_PASSWORD" "secret" $redis.passwordSecret) }}
{{- end -}}
{{- end }}

{{/* TLS to Redis (redis.tls): the flags' environment, files of the Secret mounted as redis-tls. */}}
{{- define "quotaplane.redisTLSEnv" -}}
{{- with .Values.redis.tls -}}
{{- if .enabled -}}
{{- if $.Values.redis.trial.enabled -}}
{{- fail "redis.tls.enabled needs your own Redis: the trial Redis speaks plain text (set redis.trial.enabled=false and redis.address)" -}}
{{- end -}}
- name: QUOTAPLANE_REDIS_TLS
  value: "true"
- name: QUOTAPLANE_REDIS_CA_FILE
  value: /etc/quotaplane/redis-tls/ca.crt
{{- if .clientCertificate }}
- name: QUOTAPLANE_REDIS_CERT_FILE
  value: /etc/quotaplane/redis-tls/tls.crt
- name: QUOTAPLANE_REDIS_KEY_FILE
  value: /etc/quotaplane/redis-tls/tls.key
{{- end }}
{{- with .serverName }}
- name: QUOTAPLANE_REDIS_TLS_SERVER_NAME
  value: {{ . | quote }}
{{- end }}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The Secret of redis.tls as a volume. */}}
{{- define "quotaplane.redisTLSVolume" -}}
- name: redis-tls
  secret:
    secretName: {{ required "redis.tls.secretName is required with redis.tls.enabled: a Secret with ca.crt (and tls.crt, tls.key for a client certificate)" .Values.redis.tls.secretName }}
{{- end }}
