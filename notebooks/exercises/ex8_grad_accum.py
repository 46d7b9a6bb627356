"""
Exercise 8: gradient accumulation, and DDP's no_sync.

A batch of 64 pairs may not fit in memory, but 4 micro-batches of 16 do. Gradients add up in
.grad across backward() calls, so running backward on each micro-batch and stepping once gives
the gradient of the big batch, IF each micro-batch's loss is scaled right: each loss is a
MEAN over its micro-batch, and the big batch's loss is the mean of the k means (the
micro-batches are the same size), so each must be divided by k before its backward.

Under DistributedDataParallel (DDP) every backward also averages the gradients over the
processes (an all-reduce). With k micro-steps that is k all-reduces where one is enough:
`with model.no_sync():` skips it, and the gradients add up locally. Every micro-step but the
LAST runs inside no_sync; the last one syncs, and averages the sum over the processes. (DDP
decides whether to sync when the model is called, so the forward must be inside the `with`.)

Fill in `accumulate`, then run:  python notebooks/exercises/check.py ex8
nanoRM's version is the micro-step loop in train_rm.py; read it only after yours passes.
"""


def accumulate(model, micro_batches, loss_fn):
    """Run forward and backward on each micro-batch so that model's .grad ends up holding the
    gradient of one big batch (the concatenation of the micro-batches).

    model: a DDP-wrapped model (it has a no_sync() context manager; call model(...), not
        model.module(...)). Its .grad are zero when you start; do not zero them, do not step:
        the caller steps the optimizer after you return.
    micro_batches: a list of k batches of the same size.
    loss_fn(model, batch): the MEAN loss over one batch, a scalar tensor (it calls model).

    Returns nothing.
    """
    # TODO: your code here (about six lines)
    raise NotImplementedError
