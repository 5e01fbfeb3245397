#!/usr/bin/env bash
# Opens every page of the docs site in Debian's headless chromium, served on loopback, and fails on a broken
# link or a missing image (hack/docs_check.py says how). Builds the site first (make docs).
#   hack/docs-check.sh                 check bin/site
#   hack/docs-check.sh --screenshots   also refresh docs/img/home.png and docs/img/howto-upgrade.png
set -euo pipefail
cd "$(dirname "$0")/.."
hack/install-deps.sh docs-check
make --no-print-directory docs
args=()
[ "${1:-}" = --screenshots ] && args+=(--screenshots docs/img)
start=$SECONDS
# The checker's own tests first, on a small site with the same chromium: a checker that passed everything
# would pass a broken site too.
/usr/bin/python3 -m unittest hack/docs_check_test.py
/usr/bin/python3 hack/docs_check.py --site bin/site "${args[@]}"
echo "docs-check: $((SECONDS - start))s (its own tests and the site)"
