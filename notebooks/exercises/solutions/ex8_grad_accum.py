"""
Solution to exercise 8: gradient accumulation, with DDP's no_sync.

For teachers: hand this out after the class. Check it with:
    python notebooks/exercises/check.py --solutions ex8
nanoRM's version is the micro-step loop of train_rm.py's train() (look for no_sync).
"""

import contextlib


def accumulate(model, micro_batches, loss_fn):
    """Backward of k micro-batches whose summed gradients equal one big batch's (the
    exercise file's docstring)."""
    k = len(micro_batches)
    for i, batch in enumerate(micro_batches):
        last = i == k - 1
        # all but the last micro-step skip DDP's all-reduce: the gradients add up locally,
        # and the last backward averages the sum over the processes once
        sync = contextlib.nullcontext() if last else model.no_sync()
        with sync:
            # each loss is a mean over its micro-batch: dividing by k makes the sum of the k
            # gradients the gradient of the mean over all the pairs
            (loss_fn(model, batch) / k).backward()
