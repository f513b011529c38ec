#!/bin/sh
# docs/fleet-report.png: the fleet HTML report of a demo fleet (scripts/demo_fleet.py: healthy hosts, warnings,
# a failed host, two runs of history), rendered by headless Chromium. Installs Debian's chromium when root
# and it is missing.
set -eu
BROWSER=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$BROWSER" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null
    BROWSER=$(command -v chromium)
  else
    echo "screenshot: needs chromium (apt-get install chromium, as root)" >&2
    exit 1
  fi
fi
OUT=bench/out/demo-fleet
REPORT=$(.venv/bin/python scripts/demo_fleet.py "$OUT")
"$BROWSER" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1280,1500 \
  --screenshot="$PWD/docs/fleet-report.png" "file://$PWD/$REPORT" 2>/dev/null
echo "wrote docs/fleet-report.png from $REPORT"
