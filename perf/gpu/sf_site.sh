#!/usr/bin/env bash
# Run HERE before a device session that runs `perf/gpu/run.sh sf`: puts Sample Factory 2.1.1
# and what it needs beyond the GPU image (and fastrl's .whl) into .sfsite/, which git
# ignores; name .sfsite in the device tool's `carry` beside .whl. Its packages are unpacked
# with only doom_basic's scenario kept, and numpy 1.26 (it fails on numpy 2: "setting an
# array element with a sequence" in its trajectory buffers) travels as a wheel without its
# tests, so that .whl, .sfsite and the tree stay under the 64 MiB a call carries.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx "/.sfsite/" .git/info/exclude 2>/dev/null || echo "/.sfsite/" >> .git/info/exclude
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$tmp/w" sample-factory==2.1.1 gymnasium==0.29.1 signal-slot-mp==1.0.5 \
    colorlog==6.12.0 tensorboardX==2.6.5 numpy==1.26.4
rm -rf .sfsite && mkdir -p .sfsite
python3 -m pip install --quiet --no-deps --no-index --no-compile --target .sfsite/site \
    "$tmp"/w/sample_factory-*.whl "$tmp"/w/gymnasium-*.whl "$tmp"/w/signal_slot_mp-*.whl \
    "$tmp"/w/colorlog-*.whl "$tmp"/w/tensorboardx-*.whl
(cd .sfsite/site/sf_examples/vizdoom/doom/scenarios && ls | grep -v -E '^basic\.(cfg|wad)$' \
    | xargs rm -rf)
rm -rf .sfsite/site/sf_examples/{brax,isaacgym_examples,envpool,dmlab,mujoco,atari}
find .sfsite/site -name tests -type d -prune -exec rm -rf {} +
mkdir "$tmp/np" && (cd "$tmp/np" && unzip -q "$tmp"/w/numpy-*.whl \
    && find . -type d -name tests -prune -exec rm -rf {} + \
    && zip -q -r -9 "$OLDPWD/.sfsite/$(basename "$tmp"/w/numpy-*.whl)" .)
du -sh .sfsite .whl 2>/dev/null || true
