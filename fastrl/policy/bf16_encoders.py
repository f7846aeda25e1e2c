"""The encoders' weights kept in bf16 for acting under bf16 autocast.

Under ``torch.autocast(dtype=bfloat16)`` every convolution and linear layer casts its
float32 weights to bf16 on each call. A policy worker acts on a few rows at a time, so those
casts (and reading the float32 weights they come from) take a large share of an inference
call on a CPU: without them a doom_deathmatch_bots call is 5-20% shorter (perf/log/RESULTS.md,
"four policies' inference"), and a call with four policies runs four models. :func:`lowp_encoders`
makes a copy of a model's encoders whose convolution and linear weights are already bf16;
autocast then has nothing to cast, and the output is bit for bit the same (the same bf16
values enter the same bf16 kernels). Only the encoders are copied: the recurrent core and
the heads run in float32 with autocast off (fastrl.policy.model). The copy is refreshed from
the model whenever the model's weights change (:func:`refresh`), running statistics of the
input normalisers included.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

LOWP_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)


def lowp_encoders(encoders: nn.ModuleList, dtype: torch.dtype = torch.bfloat16) -> nn.ModuleList:
    """A copy of ``encoders`` with the weights and biases of its linear and convolution
    layers in ``dtype`` (everything else, buffers included, as it was)."""
    out = copy.deepcopy(encoders)
    for module in out.modules():
        if isinstance(module, LOWP_LAYERS):
            for param in module.parameters(recurse=False):
                param.data = param.data.to(dtype)
    out.requires_grad_(False)
    return out


@torch.no_grad()
def refresh(lowp: nn.ModuleList, encoders: nn.ModuleList) -> None:
    """Copy the weights and buffers of ``encoders`` into ``lowp`` (converting each to the
    copy's dtype)."""
    for dst, src in zip(lowp.state_dict().values(), encoders.state_dict().values(),
                        strict=True):
        dst.copy_(src)
