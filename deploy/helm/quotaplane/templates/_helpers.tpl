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
