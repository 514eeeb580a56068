#!/usr/bin/env bash
# packaging/kubernetes rendered with kubectl kustomize (the base and overlays/gpu), each
# render checked offline against the Kubernetes API's schemas and dltrain's needs
# (validate.mjs), the configuration files they carry read by dltrain-agent --check-config,
# and the checker shown to refuse broken renders. No cluster is reached.
# Usage: manifests_test.sh BUILD_DIR   (exit 77 = skipped: kubectl, node or the checker's
# npm packages missing; scripts/setup installs the packages with npm ci)
set -euo pipefail
build="$1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
k8s="$here/../../packaging/kubernetes"
for p in kubectl node; do
  command -v "$p" >/dev/null || { echo "skipped: $p is not installed"; exit 77; }
done
[[ -d "$here/node_modules/kubernetes-models" ]] || { echo "skipped: run npm ci in $here (scripts/setup does)"; exit 77; }
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

for variant in base overlays/gpu; do
  out="$tmp/$(basename "$variant").yaml"
  kubectl kustomize "$k8s/$variant" >"$out"
  flags=()
  [[ "$variant" == overlays/gpu ]] && flags=(--gpu)
  mkdir -p "$tmp/conf-${variant//\//-}"
  node "$here/validate.mjs" "${flags[@]}" --write-configs "$tmp/conf-${variant//\//-}" "$out"
  # The configuration files as the pods get them, their token files in a scratch directory.
  secrets="$tmp/secrets"
  mkdir -p "$secrets"
  for t in agent client metrics; do
    (umask 077 && openssl rand -hex 32 >"$secrets/$t.token")
  done
  for f in "$tmp/conf-${variant//\//-}"/*.toml; do
    sed "s|/etc/dltrain/secrets/|$secrets/|" "$f" >"$f.local"
    "$build/bin/dltrain-agent" --config "$f.local" --check-config --name node-1 --advertise-address 10.0.0.5 ||
      fail "$variant: $(basename "$f") is refused by dltrain-agent"
  done
done

# --check-config is not vacuous either: what the daemon would refuse at start, it refuses.
leader_conf="$(ls "$tmp"/conf-base/leader.toml.local)"
sed 's|^listen_address = .*|listen_address = "localhost"|' "$leader_conf" >"$tmp/bad-leader.toml"
if "$build/bin/dltrain-agent" --config "$tmp/bad-leader.toml" --check-config 2>"$tmp/err"; then
  fail "--check-config accepted listen_address = \"localhost\""
fi
grep -qF 'listen_address: not an IP address: "localhost"' "$tmp/err" || fail "--check-config said: $(cat "$tmp/err")"

# The checker is not vacuous: each broken render is refused, naming the problem.
refuses() {  # refuses WANT SED-EXPRESSION [validate flags]
  local want="$1" expr="$2"
  shift 2
  sed "$expr" "$tmp/base.yaml" >"$tmp/broken.yaml"
  if node "$here/validate.mjs" "$@" "$tmp/broken.yaml" 2>"$tmp/err"; then fail "a render with '$expr' passed"; fi
  grep -qF "$want" "$tmp/err" || fail "a render with '$expr' was refused without '$want': $(cat "$tmp/err")"
}
refuses "containerPort must be integer" 's/containerPort: 9464/containerPort: "9464x"/'
refuses "readinessProbe: missing" 's/readinessProbe:/startupProbe:/'
refuses "prometheus.io/port 9465 is not the metrics port" 's/prometheus.io\/port: "9464"/prometheus.io\/port: "9465"/'
refuses "is not a port of the container" 's/port: control$/port: kontrol/'
refuses "requests no nvidia.com/gpu" 's/x/x/' --gpu
echo "manifests: base and overlays/gpu render, validate and carry configurations dltrain-agent accepts"
