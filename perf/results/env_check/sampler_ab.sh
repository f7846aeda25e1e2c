#!/bin/bash
# Six alternated pairs of perf/sampler_fps.py on doom_basic, pairs 1-3 "before" first and 4-6
# "after" first. BEFORE and AFTER are trees made with `git archive COMMIT | tar -x -C DIR`;
# the JSON of each run goes to sampler_ab.jsonl beside this script.
BEFORE=${BEFORE:?tree of the commit before} AFTER=${AFTER:?tree of the commit after}
PY=${PY:-python}
OUT=$(cd "$(dirname "$0")" && pwd)/sampler_ab.jsonl
: > "$OUT"
for pair in 1 2 3 4 5 6; do
  if [ "$pair" -le 3 ]; then order="before after"; else order="after before"; fi
  for side in $order; do
    if [ "$side" = before ]; then tree=$BEFORE; else tree=$AFTER; fi
    result=$(cd "$tree" && $PY perf/sampler_fps.py --env doom_basic --seconds 20 --warmup 10 \
             --device cpu --seed 1 2>/dev/null | tail -1)
    echo "{\"script\": \"sampler_fps\", \"pair\": $pair, \"side\": \"$side\", \"result\": $result}" >> "$OUT"
  done
done
