"""A policy worker that does no model work: what the sampling pipeline costs without a model.

``FASTRL_PERF_FREE_POLICY=1`` with ``--sampling_only`` (``perf/sampler_fps.py --free_policy``
sets both) makes every policy worker a :class:`FreePolicyWorker`: the same requests, the
same gather of the observations and recurrent states onto the device, the same indexed
writes of actions, log-probs, values, versions and states into the shared buffers and the
same replies, but the model's forward step is replaced by uniform random actions. Set
beside ``perf/env_fps.py`` (the envs alone, random actions, on the same cores), the FPS
of such a run says what the rollout workers, policy workers and queues cost per frame.

Why an environment variable and not a ``Config`` field: every field is a ``train.py`` flag
(``fastrl/config/flags.py`` builds one per field, with no hidden ones) and is written into
``config.json``; this is a measuring instrument, not a way to run fastrl, and must not
appear in ``--help`` or in an experiment's settings. The variable is read once, when the
policy worker is built (:func:`free_policy_requested`), and the choice is a different class:
the normal :class:`~fastrl.sampling.inference.PolicyWorker` has no branch for it. It is
honoured only with ``--sampling_only``: a run that trains ignores it (and says so), so a
variable left set can never make a learner train on random play.
"""

from __future__ import annotations

import os

import torch

from fastrl.log import log
from fastrl.sampling.inference import PolicyWorker

FREE_POLICY_VAR = "FASTRL_PERF_FREE_POLICY"


def free_policy_requested(sampling_only: bool) -> bool:
    """Whether ``FASTRL_PERF_FREE_POLICY=1`` asks for :class:`FreePolicyWorker` and the run
    only samples (a training run ignores the variable, in one line)."""
    if os.environ.get(FREE_POLICY_VAR, "0") in ("", "0"):
        return False
    if not sampling_only:
        log(f"{FREE_POLICY_VAR} ignored: the free policy is a perf instrument for "
            "--sampling_only runs, and this run trains")
        return False
    return True


class FreePolicyWorker(PolicyWorker):
    """A :class:`PolicyWorker` whose acting step costs (almost) nothing: per batch of ``B``
    rows, categorical actions uniform over each dimension's choices, continuous ones a
    standard Gaussian sample (what the buffers store before bounding), log-probs and values
    ``0`` (placeholders: nothing trains on them), the recurrent state ``[B, H]`` handed back
    unchanged. Action masks are not honoured. The models are still built and loaded with
    the learner's weights (the policy version stamped on every step is theirs), only never
    run. No CUDA graphs: there is nothing to capture."""

    def __init__(self, *args, **kwargs):
        kwargs["cuda_graphs"] = False
        super().__init__(*args, **kwargs)
        spec = self.action_spec
        # float64: (rand * n).long() stays below n for any n an int64 action can hold.
        self._nvec = (torch.tensor(spec.nvec, dtype=torch.float64, device=self.device)
                      if spec.nvec else None)
        self._continuous = spec.num_continuous

    def _act(self, k: int, obs: dict, h: torch.Tensor, e_idx: torch.Tensor | None):
        rows = h.shape[0]
        parts = []
        if self._nvec is not None:
            draw = torch.rand(rows, len(self._nvec), dtype=torch.float64, device=self.device)
            parts.append((draw * self._nvec).long())
        if self._continuous:
            parts.append(torch.randn(rows, self._continuous, device=self.device))
        actions = parts[0] if len(parts) == 1 else torch.cat([p.float() for p in parts], 1)
        zeros = torch.zeros(rows, device=self.device)
        return actions, zeros, zeros, h
