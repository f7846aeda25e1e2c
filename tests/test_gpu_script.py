"""perf/gpu/run.sh, the lent GPU machine's script, read as text (it runs only there)."""

from __future__ import annotations

import re
from pathlib import Path

RUN_SH = Path(__file__).resolve().parent.parent / "perf" / "gpu" / "run.sh"


def _stages(text: str) -> dict[str, str]:
    """Each ``case`` branch of the script: its pattern -> its body."""
    parts = re.split(r"^([\w|-]+)\)\n", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_stage_that_trains_starts_from_an_empty_train_dir():
    """A stage rerun on a warm machine (a call cut by its time limit, say) would otherwise
    resume the experiment of the first try, finished or half-done, and report its figures."""
    stages = _stages(RUN_SH.read_text())
    assert {"check", "resume", "sf", "sde"} <= set(stages)
    for stage, body in stages.items():
        for m in re.finditer(r"--train_dir[ =](\S+)", body):
            folder = m.group(1).strip('"')
            before = body[:m.start()]
            assert re.search(rf"rm -rf \"?{re.escape(folder)}\"?\s", before), \
                f"stage {stage}: --train_dir {folder} is not removed first"
