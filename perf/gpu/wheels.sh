#!/usr/bin/env bash
# Run HERE, on a machine that reaches the package registry, before a session on the lent GPU
# machine. That machine's image has Python 3.12 with CUDA torch, numpy, tensorboard and
# pytest, and can fetch nothing, so the wheels of the other dependencies travel with the
# working tree: this puts them (the versions of our .venv, cp312 builds) into .whl/, which git
# ignores; name .whl in the device tool's `carry`. About 30 MB, most of it vizdoom.
# imageio-ffmpeg (video recording only) is left out: it alone would exceed what `carry` takes.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
names='faster-fifo|gymnasium|vizdoom|setproctitle|imageio|cloudpickle|farama-notifications'
pins=$("$PY" -m pip freeze | grep -i -E "^($names)==")
rm -rf .whl && mkdir -p .whl
# shellcheck disable=SC2086
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform any -d .whl $pins
# vizdoom's wheel carries two IWADs; every scenario here loads freedoom2. Without freedoom1
# (10 MB packed) the wheels, .sfsite and the tree fit the 64 MiB a call carries.
"$PY" - <<'EOF'
import glob, os, zipfile
path = glob.glob(".whl/vizdoom-*.whl")[0]
with zipfile.ZipFile(path) as src, zipfile.ZipFile(path + ".tmp", "w", zipfile.ZIP_DEFLATED) as out:
    for info in src.infolist():
        if info.filename.endswith("/freedoom1.wad"):
            continue
        data = src.read(info.filename)
        if info.filename.endswith(".dist-info/RECORD"):
            data = b"\n".join(l for l in data.split(b"\n") if b"freedoom1.wad" not in l)
        out.writestr(info, data)
os.replace(path + ".tmp", path)
EOF
ls -l .whl
