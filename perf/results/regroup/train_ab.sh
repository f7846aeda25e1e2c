#!/bin/bash
# Alternate training-FPS runs of three trees (made with `git archive`): before the regrouping
# (c9864e7), the regrouping (be314f9) and main (cf03de8), rotating which runs first.
PY=/work/main/.venv/bin/python
out=${OUT:-/tmp/regroup_ab.jsonl}; : > $out
order=(c9864e7 be314f9 cf03de8)
for round in 1 2 3 4; do
  for k in 0 1 2; do
    tree=${order[$(( (k + round) % 3 ))]}
    dir=/tmp/fpsab/$tree
    line=$(cd $dir && PYTHONPATH=$dir timeout 300 $PY perf/train_fps.py --env doom_basic --seconds 40 --warmup 15 --device cpu --seed 1 2>/dev/null | tail -1)
    echo "{\"round\": $round, \"tree\": \"$tree\", \"load\": \"$(cut -d' ' -f1 /proc/loadavg)\", \"result\": $line}" >> $out
    echo "$round $tree $(echo "$line" | $PY -c 'import json,sys; print(json.loads(sys.stdin.read())["fps"])' 2>&1 | tail -1)"
  done
done
echo ALLDONE
