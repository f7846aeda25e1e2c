"""The policy: observations as named tensors (``obs``), the action spec and distributions, the
encoders, the recurrent core and the normalisers, put together in ``model.ActorCritic``."""
