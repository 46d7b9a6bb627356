"""
Where ColossalChat's and LLMBook's conventions meet nanoRM's: the one place a call written for
either project is translated, so the concept files keep to their concept.

ColossalChat (coati), as nanoRM takes it:
    RewardModel / Critic(pretrained=, config=, torch_dtype=, ...)
        from_pretrained_dtype: torch_dtype (or dtype) honoured; any other from_pretrained
        keyword refused by name, never ignored
    RewardModelTrainer(model, booster, optimizer, plugin, lr_scheduler, tokenizer, loss_fn,
                       max_epochs, beta, accumulation_steps, start_epoch, save_interval,
                       save_dir, coordinator)   (train_rm.py: the same order, by position or
                       keyword)
        colossalai_note: booster, plugin and coordinator do no work: torchrun stands in for the
        plugin (DDP; train_rm.py --fsdp shards), the model and optimizer are used as given
        mean_loss: the trainer trains on loss_fn(chosen_reward, reject_reward).mean()
    LogSigLoss(beta): beta accepted and unused, as ColossalChat's trainer passes it
    RLVRRewardModel(...)(input_ids, attention_mask, response_start=, response_end=, ...):
        nanoRM's reward functions decode input_ids[start : end + 1], an inclusive end as
        ColossalChat's reward functions read it; its experience maker passes exclusive ends

LLMBook (RUCAIBox), as nanoRM takes it:
    LlamaRewardModel(config).forward(sent1_idx, attention_mask_1, sent2_idx, attention_mask_2,
                                     labels, prompt_ids, lm_attn_mask, response_ids)
        is_llmbook_call, llmbook_inputs: the book's tensors as nanoRM's pair, its LM rows and
        the preference target (reward.LMRegularizedRewardModel computes the loss)
"""

import torch

from nanorm.base.command import UsageError


# ----------------------------------------------------------------------------- ColossalChat
def from_pretrained_dtype(owner, torch_dtype, kwargs):
    """The backbone's dtype from ColossalChat's from_pretrained keywords (torch_dtype, or dtype,
    its newer name); any other keyword is refused by name, as nothing here would honour it."""
    dtype = kwargs.pop("dtype", None) if torch_dtype is None else torch_dtype
    if kwargs:
        name = next(iter(kwargs))
        raise UsageError(
            f"{owner}({name}=...): not honoured by nanoRM's models (they take backbone, "
            "pretrained, config and torch_dtype): leave it out"
        )
    return dtype


def colossalai_note(booster, plugin, coordinator):
    """A line that says what stands in for ColossalAI's objects, where the user looks at once."""
    named = {"booster": booster, "plugin": plugin, "coordinator": coordinator}
    given = [name for name, value in named.items() if value is not None]
    if given:
        print(
            f"note: {', '.join(given)} not used: the model and optimizer train as given; run "
            "under torchrun for DDP (train_rm.py --fsdp shards); rank 0 logs and saves"
        )


def mean_loss(loss_fn):
    """ColossalChat's trainer trains on loss_fn(chosen_reward, reject_reward).mean(): a loss_fn
    that returns one loss per pair trains on their mean here too. A loss that already reduces to
    its mean (reduction "mean", as nanoRM's and torch's loss modules say) is used as it is."""
    if loss_fn is None or getattr(loss_fn, "reduction", None) == "mean":
        return loss_fn
    return lambda r_chosen, r_rejected, **kw: loss_fn(r_chosen, r_rejected, **kw).mean()


# ----------------------------------------------------------------------------- LLMBook
LLMBOOK_ARGS = (
    "sent1_idx",
    "attention_mask_1",
    "sent2_idx",
    "attention_mask_2",
    "labels",
    "prompt_ids",
    "lm_attn_mask",
    "response_ids",
)


def is_llmbook_call(args, kwargs):
    """Whether forward(input_ids, attention_mask, *args, **kwargs) is LLMBook's call: more than
    two positional tensors, or its keywords."""
    return bool(args) or "sent1_idx" in kwargs


def llmbook_inputs(
    sent1_idx,
    attention_mask_1,
    sent2_idx,
    attention_mask_2,
    labels,
    prompt_ids,
    lm_attn_mask,
    response_ids,
):
    """LLMBook's forward arguments as (pair, lm_rows, target):
        sent1_idx, attention_mask_1   the chosen rows (B, T1) and their mask
        sent2_idx, attention_mask_2   the rejected rows (B, T2) and their mask
        labels (B,) or (B, T)         which sentence people preferred: 0 = sent1, 1 = sent2
                                      (soft in between); (B, T) holds one value per row, as
                                      the book's example passes zeros (B, T)
        prompt_ids, lm_attn_mask      the rows (B, T) the LM term reads, and their mask
        response_ids (B, T)           prompt_ids with -100 outside the response (Hugging Face's
                                      labels)
    target = 1 - labels, the probability that sent1 wins: the book's data is all 0 (sent1 the
    chosen) and is taken as it meant it, where the book's BCE(r1 - r2, labels) with 0 trains
    towards sent2. lm_rows = (ids, mask, labels, the response tokens' mask); nanoRM's LM term
    predicts response_ids[t + 1] from the state at t (the book predicts response_ids[t] from
    position t, an identity copy)."""
    labels = labels.float()
    if labels.dim() == 2:
        if not torch.equal(labels, labels[:, :1].expand_as(labels)):
            raise ValueError("labels (B, T) must hold one value per row (which sentence won)")
        labels = labels[:, 0]
    if labels.shape != (sent1_idx.size(0),):
        raise ValueError(f"labels must be (B,) or (B, T), got {tuple(labels.shape)}")
    response = (response_ids != -100) & (lm_attn_mask != 0)  # (B, T)
    pair = (sent1_idx, attention_mask_1, sent2_idx, attention_mask_2)
    return pair, (prompt_ids, lm_attn_mask, response_ids, response), 1 - labels
