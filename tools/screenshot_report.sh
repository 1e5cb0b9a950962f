#!/usr/bin/env bash
# A headless-browser screenshot of the HTML report's landing page, to check its layout by eye: the headline table
# beside the workflow graph without overlap, one forget grid per run, the audit's verdicts.
#   tools/screenshot_report.sh [REPORT] [PNG] [WIDTH,HEIGHT]
# Defaults: results/report.html (made by `make report`), results/report_landing.png, a 1400,2400 window (1400 px wide,
# the width the layout is checked at). Needs Chromium (Debian: apt-get install chromium). `make report-screenshot`
# runs it on the Makefile's REPORT.
set -euo pipefail
report=${1:-results/report.html}
png=${2:-results/report_landing.png}
window=${3:-1400,2400}
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
    echo "screenshot_report: no Chromium found; install it (Debian: apt-get install chromium)" >&2
    exit 1
fi
if [ ! -f "$report" ]; then
    echo "screenshot_report: $report does not exist; make it with \`make report\`" >&2
    exit 1
fi
# the report is a single page that draws itself with JavaScript: give it virtual time to render before the capture
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size="$window" \
    --virtual-time-budget=15000 --screenshot="$(realpath -m "$png")" "file://$(realpath "$report")"
echo "screenshot_report: $png"
