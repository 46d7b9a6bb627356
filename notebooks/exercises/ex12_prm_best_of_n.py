"""
Exercise 12: best-of-N by a process reward model.

A process reward model (PRM) scores every step of a solution, not only its answer (Lightman et
al. 2023). For a question, sample N solutions; the PRM gives each step s of solution n the
probability p[n, s] that the solution is still right after that step. Best-of-N keeps the
solution with the highest solution reward, made from its steps' probabilities in one of two
ways:

    min   the weakest step:  min over the solution's steps of p[n, s]
    prod  every step right:  the product over its steps of p[n, s]

Solutions have different numbers of steps: `steps[n, s]` is 1 on a real step and 0 after the
solution's last step, where p holds a meaningless number that must not count.

Fill in `select_best`, then run:  python notebooks/exercises/check.py ex12
nanoRM's version is reward.solution_reward (then an argmax); read it only after yours passes.
"""

import torch


def select_best(step_probs: torch.Tensor, steps: torch.Tensor, how: str) -> torch.Tensor:
    """The index (Q,) of the solution best-of-N keeps for each of Q questions.

    step_probs: (Q, N, S) float in [0, 1], the PRM's probability for step s of solution n of
    question q. steps: (Q, N, S) 0/1 or bool, 1 on real steps (every solution has at least one).
    how: "min" or "prod". Among equal solution rewards, keep the first (the lowest index), as
    torch.argmax does. Return int64 indices on the inputs' device.

    Example: step_probs [[[0.9, 0.2], [0.6, 0.5]]], steps [[[1, 1], [1, 0]]], how "min" ->
    [1] (solution 0's weakest step is 0.2; solution 1 has one real step, 0.6).
    """
    # TODO: your code here (three to five lines)
    raise NotImplementedError
