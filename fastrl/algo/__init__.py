"""Algorithms: V-trace, the APPO loss, the learner that trains on trajectory batches, and the
learner group (data-parallel ranks of one learner)."""
