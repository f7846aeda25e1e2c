"""Population-based training (``--with_pbt``): the population's ranking, exchanges and history
(``population``, run by the runner) and the reward-shaping weights each policy's learner
trains with (``reward_weights``)."""
