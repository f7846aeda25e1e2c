#!/bin/bash
PY=/work/main/.venv/bin/python
out=/tmp/perf_ab2.jsonl; : > $out
for pair in 1 2; do
  for side in after before; do
    if [ $side = before ]; then dir=/tmp/wt; else dir=/tmp/after; fi
    line=$(cd $dir && PYTHONPATH=$dir timeout 300 $PY perf/train_fps.py --env doom_basic --seconds 90 --warmup 15 --device cpu --seed 1 2>/dev/null | tail -1)
    echo "{\"script\": \"train_fps\", \"pair\": $pair, \"side\": \"$side\", \"result\": $line}" >> $out
    echo "train_fps90 $pair $side" >> /tmp/perf_ab2.txt
  done
done
echo ALLDONE >> /tmp/perf_ab2.txt
