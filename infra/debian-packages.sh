#!/usr/bin/env bash
# The two things `make test` needs that are not Python packages, from Debian, installed
# when missing (as root, or with sudo); `make test` and .ci/run call this:
# * promtool (package prometheus): checks infra/alerts.yml, runs its unit tests
#   (infra/alerts.test.yml) and lints a worker's /metrics (tests/integration/test_alerts.py).
#   The package's postinst may try to start the Prometheus daemon, which a container
#   refuses: harmless, promtool is unpacked. Without promtool those tests fail saying so
#   (they skip only when BILLING_LEDGER_PROMTOOL_OPTIONAL is set).
# * chromium: tests/integration/test_docs_site.py opens the built docs site in it
#   (Playwright drives this system browser; no browser is downloaded).
set -euo pipefail
missing=()
command -v promtool > /dev/null || missing+=(prometheus)
command -v chromium > /dev/null || missing+=(chromium)
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if ! command -v apt-get > /dev/null; then
    echo "make test needs: ${missing[*]} (promtool and chromium); install them and run again" >&2
    exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "installing Debian packages: ${missing[*]}" >&2
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" > /dev/null \
    || { command -v promtool > /dev/null && command -v chromium > /dev/null; }
