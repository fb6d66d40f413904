#!/usr/bin/env bash
# The Helm chart's checks, none of which needs a cluster (run by
# e2e/check-packaging.sh, so by `make test`):
#
#   lint        `helm lint --strict` with each charts/vk-sandbox/ci/*-values.yaml
#   kubeconform `helm template --include-crds` with each of them, piped to
#               `kubeconform -strict` against schemas made here, offline
#               (e2e/chart/schemas.py): Kubernetes' own kinds from the
#               OpenAPI document of the k8s.io/kubernetes module the local
#               control plane is built from, the NodeInventory CRDs of crds/
#               and agent-sandbox's CRDs (e2e/agent-sandbox.sh); only the
#               Prometheus Operator's kinds have no schema here and are
#               skipped by name (any other kind without a schema fails).
#               manifests/examples/ is validated the same way.
#   unittest    helm-unittest's suites in charts/vk-sandbox/tests/ (values ->
#               objects)
#   promtool    the PrometheusRule the chart renders, as a rule file:
#               `promtool check rules`, then `promtool test rules` with
#               manifests/monitoring/prometheusrule.test.yaml
#   parity      one source: with default values the chart renders the
#               objects of the kustomize base manifests/ (built by `kubectl
#               kustomize` through an overlay that sets only the image, as a
#               user would), object by object, Helm's own labels aside; the
#               FlowSchema and the monitoring objects, when enabled, are
#               those of manifests/; placementWebhook.enabled renders the
#               base with the component manifests/placement; the dashboard
#               is manifests/monitoring/
#               grafana-dashboard.json; the chart's crds/ are crds/ byte for
#               byte (e2e/chart/parity.py)
#   schema      values.schema.json refuses `metrics.serviceMonitor.enabled:
#               "yes"` and an unknown root key, `helm install --dry-run=client`
#               failing with the schema's message; the defaults install
#   mutants     each check above run on a copy of the chart broken on
#               purpose must fail (a check that cannot fail proves nothing)
#
# Usage: e2e/check-chart.sh [lint|kubeconform|unittest|promtool|parity|schema|mutants ...]
#        (default: all). CHART=<dir> checks another copy of the chart.
# Tools: e2e/helm-tools.sh (helm, helm-unittest, kubeconform; `e2e/deps.sh
# test` builds them), kubectl of the local control plane (e2e/cluster.sh
# bin), promtool (Debian package prometheus), python3 with PyYAML.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
cd "$root"

log() { echo "chart: $*"; }
fail() { echo "chart: FAIL: $*" >&2; failures=$((failures + 1)); }
die() { echo "chart: error: $*" >&2; exit 1; }

chart=${CHART:-$root/charts/vk-sandbox}
ns=sandbox-system
release=vk-sandbox
failures=0
work=$(mktemp -d /tmp/vk-chart.XXXXXX)
trap 'rm -rf "$work"' EXIT

tool() {
  local out status=0
  out=$("$here/helm-tools.sh" which "$1") || status=$?
  ((status == 0)) || die "$out (e2e/deps.sh test builds it: e2e/helm-tools.sh build $1)"
  echo "$out"
}
helm=$(tool helm)
export HELM_CACHE_HOME=$work/helm-cache HELM_CONFIG_HOME=$work/helm-config HELM_DATA_HOME=$work/helm-data
python3 -c 'import yaml' 2>/dev/null || die "python3 with PyYAML is needed (Debian package python3-yaml; make deps installs it)"

app_version() { sed -nE 's/^appVersion:[[:space:]]*"?([^"]*)"?$/\1/p' "$1/Chart.yaml"; }

# render CHART OUT [helm template flags...]
render() {
  local c=$1 out=$2
  shift 2
  "$helm" template "$release" "$c" --namespace "$ns" --kube-version 1.37.2 "$@" >"$out"
}

# ------------------------------------------------------------------ lint
check_lint() {
  local c=${1:-$chart} f out n=0 bad=0
  for f in "$c"/ci/*-values.yaml; do
    if out=$("$helm" lint --strict "$c" --namespace "$ns" --kube-version 1.37.2 -f "$f" 2>&1); then
      n=$((n + 1))
    else
      fail "lint: helm lint --strict with ${f#"$c"/}: $(tail -5 <<<"$out")"
      bad=$((bad + 1))
    fi
  done
  ((n + bad > 0)) || { fail "lint: no ci/*-values.yaml in $c"; return 1; }
  ((bad == 0)) || return 1
  log "lint: helm lint --strict clean with $n values file(s): $(cd "$c/ci" && echo *-values.yaml)"
}

# ----------------------------------------------------------- kubeconform
schemas_dir() {
  local k8s agent dir swagger mod
  k8s=$(tr -d '[:space:]' <"$here/k8s-version")
  agent=$("$here/agent-sandbox.sh" release)
  local crds_hash
  crds_hash=$(cat "$root"/crds/*.yaml "$here/chart/schemas.py" | sha256sum | cut -c1-12)
  dir=$root/.cache/chart-schemas-$k8s-$agent-$crds_hash
  if [[ ! -f "$dir/.built" ]]; then
    mod=$(cd / && go mod download -json "k8s.io/kubernetes@$k8s" 2>/dev/null | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p') ||
      true
    swagger=$mod/api/openapi-spec/swagger.json
    [[ -f "$swagger" ]] || die "kubeconform: no OpenAPI document of Kubernetes $k8s ($swagger): run make deps (the control plane's module)"
    local agent_out agent_status=0
    agent_out=$("$here/agent-sandbox.sh" build 2>&1 >/dev/null) || agent_status=$?
    ((agent_status == 0)) || die "kubeconform: agent-sandbox $agent's CRDs are needed: $agent_out"
    local acrds
    acrds=$(dirname "$("$here/agent-sandbox.sh" build 2>/dev/null)")/crds
    rm -rf "$dir.tmp"
    mkdir -p "$dir.tmp"
    python3 "$here/chart/schemas.py" "$dir.tmp" "$swagger" "$root/crds" "$acrds" >"$dir.tmp/.built" ||
      die "kubeconform: writing the schemas failed"
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
  fi
  echo "$dir"
}

# kubeconform_file FILE WHAT: validated; prints "n valid" or fails.
kubeconform_file() {
  local file=$1 what=$2 out status=0 skipped
  out=$("$kubeconform" -strict -summary -verbose -output json -kubernetes-version 1.37.2 \
    -schema-location "$schemas/native/{{ .ResourceKind }}{{ .KindSuffix }}.json" \
    -schema-location "$schemas/crd/{{ .Group }}/{{ .ResourceKind }}_{{ .ResourceAPIVersion }}.json" \
    -ignore-missing-schemas "$file" 2>&1) || status=$?
  if ((status != 0)); then
    fail "kubeconform: $what: $(jq -r '.resources[]? | select(.status != "statusValid" and .status != "statusSkipped") | "\(.kind)/\(.name): \(.msg)"' <<<"$out" 2>/dev/null | head -5 || echo "$out")"
    return 1
  fi
  # Skipped = no schema: only the Prometheus Operator's kinds may be.
  skipped=$(jq -r '.resources[]? | select(.status == "statusSkipped") | .kind' <<<"$out" | sort -u | tr '\n' ' ')
  local k
  for k in $skipped; do
    case "$k" in
      PodMonitor | ServiceMonitor | PrometheusRule) ;;
      *) fail "kubeconform: $what: no schema for $k (only the Prometheus Operator's kinds may lack one)"; return 1 ;;
    esac
  done
  jq -r --arg s "$skipped" '"\(.summary.valid) valid\(if $s != "" then ", skipped (no schema here): " + $s else "" end)"' <<<"$out"
}

check_kubeconform() {
  local c=${1:-$chart} f res bad=0 n=0
  kubeconform=$(tool kubeconform)
  schemas=$(schemas_dir)
  for f in "$c"/ci/*-values.yaml; do
    if ! render "$c" "$work/kc.yaml" --include-crds -f "$f" 2>"$work/kc.err"; then
      fail "kubeconform: helm template with ${f#"$c"/}: $(tail -3 "$work/kc.err")"
      bad=$((bad + 1)); continue
    fi
    if res=$(kubeconform_file "$work/kc.yaml" "helm template with ${f#"$c"/}"); then
      log "kubeconform: -strict, ${f#"$c"/}: $res"
      n=$((n + 1))
    else
      bad=$((bad + 1))
    fi
  done
  if [[ -z "${1:-}" ]]; then
    if res=$(kubeconform_file manifests/examples "manifests/examples"); then
      log "kubeconform: -strict, manifests/examples/ (agent-sandbox $("$here/agent-sandbox.sh" release) CRDs): $res"
    else
      bad=$((bad + 1))
    fi
  fi
  ((bad == 0))
}

# -------------------------------------------------------------- unittest
check_unittest() {
  local c=${1:-$chart} ut out
  ut=$(tool helm-unittest)
  if out=$("$ut" --color=false "$c" 2>&1); then
    log "unittest: $(grep -E '^(Charts|Test Suites|Tests):' <<<"$out" | tr -s ' ' | paste -sd ';' -)"
  else
    fail "unittest: helm-unittest $c: $(grep -E 'FAIL|^[[:space:]]+- |Error|Expected|Actual|^Tests:' <<<"$out" | head -12)"
    return 1
  fi
}

# -------------------------------------------------------------- promtool
check_promtool() {
  local c=${1:-$chart} out
  command -v promtool >/dev/null || die "promtool not found (Debian package prometheus; make deps installs it)"
  mkdir -p "$work/prom"
  if ! render "$c" "$work/prom/rendered.yaml" --set metrics.prometheusRule.enabled=true \
    --show-only templates/prometheusrule.yaml 2>"$work/prom/err"; then
    fail "promtool: helm template: $(tail -3 "$work/prom/err")"
    return 1
  fi
  python3 -c '
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
assert len(docs) == 1 and docs[0]["kind"] == "PrometheusRule", "expected one PrometheusRule"
yaml.safe_dump(docs[0]["spec"], open(sys.argv[2], "w"), sort_keys=False)
' "$work/prom/rendered.yaml" "$work/prom/vk-sandbox.rules.yaml" || { fail "promtool: no PrometheusRule rendered"; return 1; }
  cp manifests/monitoring/prometheusrule.test.yaml "$work/prom/"
  if ! out=$(promtool check rules "$work/prom/vk-sandbox.rules.yaml" 2>&1); then
    fail "promtool check rules (the chart's PrometheusRule): $out"
    return 1
  fi
  local rules
  rules=$(grep -oE 'SUCCESS: [0-9]+ rules found' <<<"$out" || echo "$out")
  if ! out=$(cd "$work/prom" && promtool test rules prometheusrule.test.yaml 2>&1); then
    fail "promtool test rules (the chart's PrometheusRule): $(tail -8 <<<"$out")"
    return 1
  fi
  log "promtool: the rendered PrometheusRule: check rules $rules; test rules with manifests/monitoring/prometheusrule.test.yaml: $(tail -1 <<<"$out" | tr -s ' ')"
}

# ---------------------------------------------------------------- parity
check_parity() {
  local c=${1:-$chart} kubectl out bad=0 p=$work/parity
  kubectl="$("$here/cluster.sh" bin)/kubectl"
  [[ -x "$kubectl" ]] || die "parity: no kubectl in $(dirname "$kubectl") (make deps)"
  mkdir -p "$p/overlay"
  # The user's overlay: the shipped base, the chart's default image.
  cat >"$p/overlay/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - base
images:
  - {name: vk-sandbox, newName: ghcr.io/cocoonstack/vk-sandbox, newTag: "$(app_version "$c")"}
EOF
  cp -r manifests "$p/overlay/base"
  "$kubectl" kustomize "$p/overlay" >"$p/kustomize.yaml" || { fail "parity: kubectl kustomize manifests/"; return 1; }
  render "$c" "$p/chart.yaml" || { fail "parity: helm template with default values"; return 1; }
  if out=$(python3 "$here/chart/parity.py" objects "$p/chart.yaml" "$p/kustomize.yaml"); then
    log "parity: default values vs the kustomize base manifests/: ${out#parity: }"
  else
    fail "parity: the chart (default values) and the kustomize base manifests/ differ: $out"; bad=1
  fi
  # The placement webhook: the chart with it on (cert-manager's CA
  # injector, as the component's annotation) vs the base with the
  # component manifests/placement.
  mkdir -p "$p/placement"
  cat >"$p/placement/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../overlay
components:
  - ../overlay/base/placement
EOF
  if "$kubectl" kustomize "$p/placement" >"$p/placement-kustomize.yaml" &&
    render "$c" "$p/placement-chart.yaml" --set placementWebhook.enabled=true \
      --set placementWebhook.certManagerCertificate="$ns/vk-sandbox-webhook"; then
    if out=$(python3 "$here/chart/parity.py" objects "$p/placement-chart.yaml" "$p/placement-kustomize.yaml"); then
      log "parity: placementWebhook.enabled vs manifests/ with the component manifests/placement: ${out#parity: }"
    else
      fail "parity: the chart with placementWebhook.enabled and manifests/ with manifests/placement differ: $out"; bad=1
    fi
  else
    fail "parity: rendering the placement webhook (kubectl kustomize with manifests/placement, or helm template)"; bad=1
  fi
  render "$c" "$p/fs.yaml" --set flowSchema.enabled=true --show-only templates/flowschema.yaml &&
    if out=$(python3 "$here/chart/parity.py" objects "$p/fs.yaml" manifests/flowschema.yaml); then
      log "parity: flowSchema.enabled vs manifests/flowschema.yaml: ${out#parity: }"
    else
      fail "parity: the chart's FlowSchema and manifests/flowschema.yaml differ: $out"; bad=1
    fi
  render "$c" "$p/mon.yaml" --set metrics.podMonitor.enabled=true --set metrics.prometheusRule.enabled=true \
    --show-only templates/podmonitor.yaml --show-only templates/prometheusrule.yaml &&
    { cat manifests/monitoring/podmonitor.yaml; echo "---"; cat manifests/monitoring/prometheusrule.yaml; } >"$p/mon-want.yaml" &&
    if out=$(python3 "$here/chart/parity.py" objects "$p/mon.yaml" "$p/mon-want.yaml"); then
      log "parity: metrics.podMonitor/prometheusRule vs manifests/monitoring/: ${out#parity: }"
    else
      fail "parity: the chart's PodMonitor/PrometheusRule and manifests/monitoring/ differ: $out"; bad=1
    fi
  render "$c" "$p/dash.yaml" --set metrics.grafanaDashboard.enabled=true --show-only templates/grafana-dashboard.yaml &&
    if out=$(python3 "$here/chart/parity.py" dashboard "$p/dash.yaml" manifests/monitoring/grafana-dashboard.json); then
      log "parity: metrics.grafanaDashboard vs manifests/monitoring/grafana-dashboard.json: ${out#parity: }"
    else
      fail "parity: the chart's dashboard and manifests/monitoring/grafana-dashboard.json differ: $out"; bad=1
    fi
  local f n=0
  for f in crds/*.yaml; do
    if cmp -s "$f" "$c/crds/$(basename "$f")"; then n=$((n + 1)); else
      fail "parity: $c/crds/$(basename "$f") is not crds/$(basename "$f") (copy it: cp crds/*.yaml charts/vk-sandbox/crds/)"; bad=1
    fi
  done
  [[ "$(find "$c/crds" -name '*.yaml' | wc -l)" == "$(find crds -name '*.yaml' | wc -l)" ]] ||
    { fail "parity: $c/crds/ and crds/ hold different files"; bad=1; }
  ((bad == 0)) && log "parity: the chart's crds/ are crds/ ($n files, byte for byte)"
  ((bad == 0))
}

# ---------------------------------------------------------------- schema
check_schema() {
  local c=${1:-$chart} out bad=0
  # helm install as a user runs it, without a cluster (--dry-run=client).
  inst() { "$helm" install "$release" "$c" --namespace "$ns" --dry-run=client "$@" 2>&1; }
  if out=$(inst --set-json 'metrics.serviceMonitor.enabled="yes"'); then
    fail "schema: helm install accepted metrics.serviceMonitor.enabled: \"yes\""; bad=1
  elif grep -q 'values don.t meet the specifications of the schema' <<<"$out" &&
    grep -qE 'metrics/serviceMonitor/enabled|metrics.serviceMonitor.enabled' <<<"$out" && grep -q 'boolean' <<<"$out"; then
    log "schema: metrics.serviceMonitor.enabled: \"yes\" refused: $(grep -m1 -E 'serviceMonitor' <<<"$out" | sed 's/^[[:space:]-]*//')"
  else
    fail "schema: enabled: \"yes\" failed without the schema's message: $out"; bad=1
  fi
  if out=$(inst --set replicas=2); then
    fail "schema: helm install accepted an unknown root key (replicas)"; bad=1
  elif grep -q 'values don.t meet the specifications of the schema' <<<"$out" && grep -q 'replicas' <<<"$out"; then
    log "schema: unknown root key refused: $(grep -m1 'replicas' <<<"$out" | sed 's/^[[:space:]-]*//')"
  else
    fail "schema: an unknown root key failed without the schema's message: $out"; bad=1
  fi
  if out=$(inst); then
    log "schema: the default values install (helm install --dry-run=client)"
  else
    fail "schema: helm install --dry-run=client with the defaults: $(tail -5 <<<"$out")"; bad=1
  fi
  ((bad == 0))
}

# --------------------------------------------------------------- mutants
# mutant NAME CHECK FILE PYTHON-EXPR: a copy of the chart whose FILE is
# rewritten by PYTHON-EXPR (s = its text); CHECK must fail on it.
mutant() {
  local name=$1 check=$2 file=$3 expr=$4 m=$work/mutant-$1
  rm -rf "$m"
  cp -r "$chart" "$m"
  python3 -c "
import sys
p = sys.argv[1]
s = open(p).read()
t = $expr
assert t != s, 'the mutation changed nothing'
open(p, 'w').write(t)
" "$m/$file" || { fail "mutants: $name: could not apply the mutation to $file"; return; }
  local saved=$failures out status=0
  out=$("check_$check" "$m" 2>&1) || status=$?
  failures=$saved
  if ((status != 0)); then
    log "mutants: $check fails on $name ($file): $(grep -A4 -m1 'FAIL' <<<"$out" | sed 's/^chart: FAIL: //' | tr -s '[:space:]' ' ' | cut -c1-400)"
  else
    fail "mutants: $check passed on a chart broken on purpose ($name in $file): $out"
  fi
}

check_mutants() {
  mutant yaml-syntax lint templates/daemonset.yaml 's.replace("  template:\n", "  template\n", 1)'
  mutant misplaced-field kubeconform templates/daemonset.yaml \
    's.replace("      hostNetwork: true\n", "      hostNetwork: true\n      hostNetworking: true\n", 1)'
  mutant max-surge unittest templates/daemonset.yaml 's.replace("maxSurge: 0", "maxSurge: 1", 1)'
  mutant rule-expr promtool files/prometheus-rules.yaml 's.replace("== 0\n", "== \n", 1)'
  mutant rbac-verb parity templates/rbac.yaml 's.replace("verbs: [\"list\", \"watch\", \"delete\"]", "verbs: [\"list\", \"watch\", \"delete\", \"update\"]", 1)'
  mutant open-schema schema values.schema.json 's.replace("\"additionalProperties\": false,\n  \"properties\"", "\"properties\"", 1)'
}

sections=("$@")
((${#sections[@]})) || sections=(lint kubeconform unittest promtool parity schema mutants)
for s in "${sections[@]}"; do
  case "$s" in
    lint | kubeconform | unittest | promtool | parity | schema | mutants) "check_$s" || true ;;
    *) die "unknown section '$s' (lint, kubeconform, unittest, promtool, parity, schema, mutants)" ;;
  esac
done
if ((failures)); then
  echo "chart: $failures check(s) failed" >&2
  exit 1
fi
log "all checks passed (${sections[*]})"
