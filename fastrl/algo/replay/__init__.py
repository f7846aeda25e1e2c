"""The replay family (``--algo apex``, ``r2d2``): the learners (``apex``, ``r2d2``), their
stores (``store``: rows of trajectories; ``sequence_store``: R2D2's sequences; ``sumtree``:
the priorities), the Q-learning targets (``targets``), the dueling Q heads (``dueling``) and
the actors' exploration (``exploration``). The learner station that feeds a store is
``fastrl/runner/replay_station.py``."""
