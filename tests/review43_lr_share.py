"""Issue 43 defect 1 review (run: PYTHONPATH=. python tests/review43_lr_share.py): --lr_schedule linear_decay decays each policy over 1/P of
--train_for_env_steps, but envs draw a policy per *episode*, so a policy whose episodes are
longer acts (and trains on) more than 1/P of the frames. Simulates the rollout workers'
PolicyAssignment with two policies whose episodes last 500 and 50 steps (a good and a poor
CartPole policy in a PBT population) and prints each policy's share of the frames and its
learning-rate factor (learner.py's formula) at points of the run."""
import numpy as np

from fastrl.sampling.trajectories import PolicyAssignment

P, SLOTS, ROLLOUT, BUDGET = 2, 32, 32, 1_000_000
LENGTH = {0: 500, 1: 50}
assign = PolicyAssignment(SLOTS, P, seed=1, splits=[list(range(SLOTS))])
left = np.array([LENGTH[int(k)] for k in assign.current])
frames = np.zeros(P)
total, checkpoints = 0, [0.25, 0.5, 0.6, 0.75, 1.0]
while total < BUDGET:
    for _ in range(ROLLOUT):  # one trajectory of every slot
        for j in range(SLOTS):
            frames[assign.current[j]] += 1
            left[j] -= 1
            if left[j] == 0:
                assign.episode_ended(j)  # the next episode starts now; the policy drawn
                left[j] = LENGTH[int(assign.next[j])]  # for it takes over at the boundary
        total += SLOTS
    assign.begin(list(range(SLOTS)), list(range(SLOTS)), np.zeros((SLOTS, 1)))
    while checkpoints and total >= checkpoints[0] * BUDGET:
        share = BUDGET / P  # learner.py: each policy decays over its 1/P share
        lr = [max(0.0, 1 - frames[k] / share) for k in range(P)]
        print(f"run at {checkpoints.pop(0):4.0%}: frame shares "
              f"{[round(float(f) / total, 2) for f in frames]}, lr factor "
              f"{[round(float(x), 2) for x in lr]} (the run's own: {max(0, 1 - total / BUDGET):.2f})")
