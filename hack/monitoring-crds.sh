#!/usr/bin/env bash
# Prints the directory of prometheus-operator's CRDs (ServiceMonitor,
# PrometheusRule, ...) at a pinned version, from its Go module: only the Go
# module proxy, cached in the Go module cache outside the repository. The
# chart tests install them on the test API server to validate the chart's
# ServiceMonitors and PrometheusRule.
#
#   QUOTAPLANE_MONITORING_CRDS=$(hack/monitoring-crds.sh) go test -run Helm ./config/
set -euo pipefail

PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
dir=$(GOTOOLCHAIN=local GOFLAGS=-mod=mod go mod download -json "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION" |
	sed -n 's|.*"Dir": "\(.*\)".*|\1|p')
crds="$dir/example/prometheus-operator-crd"
if [[ ! -f "$crds/monitoring.coreos.com_servicemonitors.yaml" ]]; then
	echo "hack/monitoring-crds.sh: no ServiceMonitor CRD in $crds" >&2
	exit 1
fi
echo "$crds"
