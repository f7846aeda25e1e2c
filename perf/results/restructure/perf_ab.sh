#!/bin/bash
# Alternate before (/tmp/wt = HEAD d46314c) and after (/tmp/after = restructured tree) runs.
PY=/work/main/.venv/bin/python
out=/tmp/perf_ab.jsonl; : > $out
for script in train_fps sampler_fps; do
  if [ $script = train_fps ]; then S=40; else S=30; fi
  for pair in 1 2 3; do
    for side in before after; do
      if [ $side = before ]; then dir=/tmp/wt; else dir=/tmp/after; fi
      line=$(cd $dir && PYTHONPATH=$dir timeout 300 $PY perf/$script.py --env doom_basic --seconds $S --warmup 15 --device cpu --seed 1 2>/tmp/perf_err_${script}_${side}_$pair.log | tail -1)
      fps=$(echo "$line" | $PY -c "import json,sys; d=json.loads(sys.stdin.read()); print(d['fps'], d['settings'].get('precision'))" 2>/dev/null)
      echo "$script $pair $side $fps" | tee -a /tmp/perf_ab.txt
      echo "{\"script\": \"$script\", \"pair\": $pair, \"side\": \"$side\", \"result\": $line}" >> $out
    done
  done
done
echo ALLDONE >> /tmp/perf_ab.txt
