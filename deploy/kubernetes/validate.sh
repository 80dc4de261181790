#!/usr/bin/env bash
# Validates the Kubernetes files in deploy/kubernetes without a cluster:
#   1. renders the kustomization with kubectl's kustomize, alone and with
#      every component;
#   2. every built-in object (rendered, examples, the Secret example) against
#      Kubernetes' OpenAPI schemas for 1.30 and 1.37 in strict mode
#      (kubernetes-validate: unknown fields are errors);
#   3. cert-manager, Prometheus Operator and KEDA resources against their
#      projects' API types (@kubernetes-models: JSON schema, then TypeScript
#      for unknown fields);
#   4. the TokenBucketAdmission CRD and every TokenBucketAdmission against
#      its schema and CEL rules, broken ones refused, the acme-corp twin of
#      config/acme-corp.toml;
#   5. components/kueue's ResourceFlavor, ClusterQueue and LocalQueue against
#      Kueue's CRDs (v1beta2, vendored from Kueue v0.19.2 in validate/kueue/:
#      schema with its defaults, unknown fields refused, CEL rules), broken
#      ones refused; that the queued model server's queues, quota and flavor
#      admit it and Fairway's placement still sees it, and that it is the
#      example model server plus the queue label;
#   6. the Grafana dashboard copy is byte-for-byte ../grafana's;
#   7. the kube-scheduler configuration's fields;
#   8. the store each render runs is the one its policy names: the single
#      Valkey, or components/store-sentinel's three pods and sentinels
#      (hosts, port, primary name, quorum, password, anti-affinity,
#      disruption budget; broken ones refused), whose fairway.toml is
#      config/fairway.toml but for the store line;
#   and that the policy, manifests and examples agree (ports, paths,
#   Services, Secret keys, models, backends).
# Installs what it needs on first use: Python packages into target/k8s-venv
# (deploy/kubernetes/validate/requirements.txt), npm packages into
# target/k8s-node (validate/package.json), and python3-venv / nodejs from
# Debian when missing. Exits non-zero on any failure.
#
#   deploy/kubernetes/validate.sh
set -euo pipefail
cd "$(dirname "$0")/../.."

kdir=deploy/kubernetes
vdir=$kdir/validate
venv=target/k8s-venv
nodedir=target/k8s-node
work=target/k8s-validate
start=$SECONDS

sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "$@" >/dev/null
}

# Python: kubernetes-validate, jsonschema, PyYAML, cel-python, kubectl (with
# kustomize).
stamp=$(sha256sum "$vdir/requirements.txt" | cut -c1-16)
if [ "$(cat "$venv/.fairway-stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "installing $vdir/requirements.txt into $venv"
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    apt_install python3 python3-venv
    python3 -m venv "$venv"
  fi
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$vdir/requirements.txt"
  echo "$stamp" > "$venv/.fairway-stamp"
fi

# Node: the @kubernetes-models validators and TypeScript.
if ! command -v npm >/dev/null 2>&1; then
  apt_install nodejs npm
fi
stamp=$(cat "$vdir/package.json" "$vdir/package-lock.json" | sha256sum | cut -c1-16)
if [ "$(cat "$nodedir/.fairway-stamp" 2>/dev/null)" != "$stamp" ]; then
  echo "installing $vdir/package.json into $nodedir"
  mkdir -p "$nodedir"
  cp "$vdir/package.json" "$vdir/package-lock.json" "$nodedir/"
  (cd "$nodedir" && npm ci --no-audit --no-fund --silent)
  echo "$stamp" > "$nodedir/.fairway-stamp"
fi

failed=()
rm -rf "$work"
mkdir -p "$work/all"

echo "== kustomize ($("$venv/bin/kubectl" version --client | tr '\n' ' '))"
# The base, and the base with every component it leaves out (an overlay
# made here).
{
  echo "apiVersion: kustomize.config.k8s.io/v1beta1"
  echo "kind: Kustomization"
  echo "resources: [../../../$kdir]"
  echo "components:"
  for c in "$kdir"/components/*/; do
    name=$(basename "$c")
    grep -qE "^ *- components/$name/? *\$" "$kdir/kustomization.yaml" || echo "  - ../../../$kdir/components/$name"
  done
} > "$work/all/kustomization.yaml"
if "$venv/bin/kubectl" kustomize "$kdir" > "$work/base.yaml" \
  && "$venv/bin/kubectl" kustomize "$work/all" > "$work/all.yaml"; then
  echo "  ok    rendered $(grep -c '^kind:' "$work/base.yaml") objects, $(grep -c '^kind:' "$work/all.yaml") with every component"
else
  echo "  FAIL  kubectl kustomize"
  failed+=("kustomize")
fi

echo "== dashboard copy"
if cmp "$kdir/dashboards/fairway.json" deploy/grafana/dashboards/fairway.json; then
  echo "  ok    $kdir/dashboards/fairway.json is deploy/grafana/dashboards/fairway.json"
else
  echo "  FAIL  $kdir/dashboards/fairway.json differs from deploy/grafana/dashboards/fairway.json:"
  echo "        cp deploy/grafana/dashboards/fairway.json $kdir/dashboards/fairway.json"
  failed+=("dashboard copy")
fi

if [ -s "$work/all.yaml" ]; then
  echo "== manifests, CRD, scheduler configuration, consistency"
  "$venv/bin/python" "$vdir/check.py" "$work/base.yaml" "$work/all.yaml" "$work/third-party.json" \
    || failed+=("check.py")
  if [ -f "$work/third-party.json" ]; then
    echo "== third-party custom resources"
    node "$vdir/crs.mjs" "$work/third-party.json" "$nodedir" || failed+=("crs.mjs")
  fi
fi

echo
if [ ${#failed[@]} -gt 0 ]; then
  echo "deploy/kubernetes: FAILED (${failed[*]}) in $((SECONDS - start))s"
  exit 1
fi
echo "deploy/kubernetes: all checks passed in $((SECONDS - start))s"
