#!/usr/bin/env bash
# Regenerates docs/timeline.png, the README's picture of `phalanx timeline`: a real job of 4
# CPU workers (tests/workers/steps_then_fail.py, no torch) whose rank 2 exits 3 at step 12 of
# its first attempt, restarted once; its page opened in a headless Chromium (Debian's
# `chromium`, as the tests use it), the screenshot cropped to the page's content.
# usage: bash scripts/timeline-screenshot.sh [OUT.png]   (run inside the test virtualenv)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-docs/timeline.png}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
python -m phalanx --nproc-per-node 4 --max-restarts 1 --log-dir "$work/logs" \
    tests/workers/steps_then_fail.py 30 2 12 >/dev/null
run_dir=$(dirname "$(ls "$work"/logs/*/events.jsonl)")
python -m phalanx timeline "$run_dir" -o "$work/run.html"
PYTHONPATH="$PWD/tests:$PYTHONPATH" python - "$work/run.html" "$out" <<'PY'
import sys
from pathlib import Path

from PIL import Image, ImageChops

from support.browser import screenshot

page, out = Path(sys.argv[1]), Path(sys.argv[2])
shot = screenshot(page, page.with_suffix(".png"), (1200, 700))
image = Image.open(shot).convert("RGB")
# Crop the white margin away (keeping 12 px), then store it with a small palette.
box = ImageChops.difference(image, Image.new("RGB", image.size, "white")).getbbox()
assert box is not None, "the screenshot is blank"
left, top, right, bottom = box
image = image.crop((max(left - 12, 0), max(top - 12, 0), right + 12, bottom + 12))
out.parent.mkdir(parents=True, exist_ok=True)
image.quantize(colors=256, method=Image.Quantize.MAXCOVERAGE).save(out, optimize=True)
print(f"{out}: {image.size[0]}x{image.size[1]}, {out.stat().st_size} bytes")
PY
