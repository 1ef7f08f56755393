#!/usr/bin/env bash
# Renders the HTML report of `hetrain profile` in headless Chromium (Debian package chromium,
# installed by tools/install_deps.sh) and checks that the page has its four charts, with
# their points, bars and areas, and that Chromium logs no console message (no script error, no
# failed resource load). A page that does log errors is checked first, so the check is known
# to see them. Skips (exit 77) only when chromium is not installed.
# usage: report_chromium.sh HETRAIN_BINARY [SCREENSHOT.png]
set -euo pipefail
HT=$1
SHOT=${2:-}
if ! command -v chromium >/dev/null 2>&1; then
  echo "SKIP: chromium is not installed (Debian package 'chromium'; tools/install_deps.sh installs it)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME=$tmp/cache HOME=$tmp

# Headless, no network at all (every host resolves to nothing), its own profile directory.
render() {  # render URL OUT_DOM OUT_LOG [extra flags]
  local url=$1 dom=$2 log=$3
  shift 3
  timeout 120 chromium --headless --no-sandbox --disable-gpu --no-first-run \
    --user-data-dir="$tmp/chromium" --host-resolver-rules="MAP * ~NOTFOUND" \
    --enable-logging=stderr --v=0 "$@" "$url" >"$dom" 2>"$log"
}

# 1. The console check sees errors: a page with console.error and an uncaught exception.
cat >"$tmp/bad.html" <<'EOF'
<!DOCTYPE html><html><body><p>bad</p><script>console.error("boom"); notDefined();</script></body></html>
EOF
render "file://$tmp/bad.html" "$tmp/bad.dom" "$tmp/bad.log" --dump-dom
if ! grep -q 'CONSOLE.*boom' "$tmp/bad.log" || ! grep -q 'CONSOLE.*notDefined' "$tmp/bad.log"; then
  echo "FAIL: chromium did not report the console errors of a bad page:"
  cat "$tmp/bad.log"
  exit 1
fi

# 2. A small profiled run with every output.
cat >"$tmp/small.toml" <<'EOF'
layers = 1
width = 32
heads = 2
context = 16
batch_size = 8
EOF
"$HT" profile --preset gpt-mini --config "$tmp/small.toml" --steps 3 --threads 2 --no-progress \
  --report "$tmp/report.html" --trace "$tmp/trace.json" --json "$tmp/profile.json" \
  >"$tmp/profile.out" 2>&1 || { cat "$tmp/profile.out"; exit 1; }

# Self-contained: nothing the browser would fetch.
if grep -Eq '<script|<link|<img|<iframe| src=| href=|url\(' "$tmp/report.html"; then
  echo "FAIL: the report references external resources or scripts"
  exit 1
fi

render "file://$tmp/report.html" "$tmp/report.dom" "$tmp/report.log" --dump-dom
if grep -q 'CONSOLE' "$tmp/report.log"; then
  echo "FAIL: console messages while rendering the report:"
  grep 'CONSOLE' "$tmp/report.log"
  exit 1
fi
fail=0
for id in roofline time-breakdown memory-timeline loss-curve; do
  grep -q "<svg id=\"$id\"" "$tmp/report.dom" || { echo "FAIL: chart '$id' missing"; fail=1; }
done
points=$(grep -o 'class="point"' "$tmp/report.dom" | wc -l)
bars=$(grep -o 'class="bar"' "$tmp/report.dom" | wc -l)
areas=$(grep -o 'class="area"' "$tmp/report.dom" | wc -l)
((points >= 5)) || { echo "FAIL: roofline has $points points, expected >= 5"; fail=1; }
((bars >= 5)) || { echo "FAIL: time breakdown has $bars bars, expected >= 5"; fail=1; }
((areas == 6)) || { echo "FAIL: memory timeline has $areas tag areas, expected 6 (one per memory tag)"; fail=1; }
grep -q '<polyline' "$tmp/report.dom" || { echo "FAIL: no loss curve line"; fail=1; }
((fail == 0)) || exit 1

# 3. It renders to pixels (the screenshot in docs/ is made the same way).
out=${SHOT:-$tmp/report.png}
render "file://$tmp/report.html" /dev/null "$tmp/shot.log" --hide-scrollbars \
  --window-size=940,2700 --screenshot="$out"
size=$(stat -c %s "$out")
((size > 50000)) || { echo "FAIL: screenshot $out is only $size bytes"; exit 1; }
echo "report OK: 4 charts ($points roofline points, $bars bars, $areas memory areas), no console messages, screenshot $size bytes"
