#!/bin/bash
# Run tests/test_distributed.py N times (default 50) on a clean clone of HEAD and count failures:
# the evidence that the two-rank fixture no longer aborts at exit (issue 15, item 6).
# Usage: bash tools/ddp_repeat.sh [N]   (from the repository root, after `make install`)
set -u
n=${1:-50}
root=$(pwd)
clone=$(mktemp -d)/clone
git clone -q "$root" "$clone"
fails=0
for i in $(seq 1 "$n"); do
  if (cd "$clone" && PYTHONPATH="$clone/src" "$root/.venv/bin/python" -m pytest -q \
        tests/test_distributed.py -p no:cacheprovider > "$clone/run_$i.log" 2>&1); then
    echo "run $i: $(tail -1 "$clone/run_$i.log")"
  else
    fails=$((fails + 1)); echo "run $i FAILED: log kept in $clone/run_$i.log"
  fi
done
echo "$fails failures in $n runs of tests/test_distributed.py at $(git rev-parse --short HEAD)"
[ "$fails" -eq 0 ]
