#!/usr/bin/env bash
# Refreshes vendor/ from the chart library pinned in package.json and package-lock.json
# (uPlot, MIT): `npm ci` installs exactly the locked version, checked against the lock's
# integrity hash, and its dist files and licence are copied here. The build embeds vendor/
# as it is committed; nothing is fetched at build or run time. Run after changing the pin.
# Usage: dashboard/vendor.sh [--check]   (--check: only compare vendor/ with the package)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
npm ci --no-audit --no-fund --ignore-scripts >/dev/null
files=(dist/uPlot.iife.min.js:uPlot.iife.min.js dist/uPlot.min.css:uPlot.min.css LICENSE:LICENSE-uPlot)
status=0
for f in "${files[@]}"; do
  src="node_modules/uplot/${f%%:*}"
  dst="vendor/${f##*:}"
  if [[ "${1:-}" == "--check" ]]; then
    cmp -s "$src" "$dst" || { echo "dashboard/vendor.sh: $dst differs from $src" >&2; status=1; }
  else
    cp "$src" "$dst"
  fi
done
exit "$status"
