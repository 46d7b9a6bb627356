"""
nanorm: what the concept files at the top (model.py, reward.py, critic.py, verifiable.py,
train_rm.py, eval_rm.py, data/) lean on, one concept per file. A first reading can skip it all.

The attic: what stands on the concept files. Its ground floor, what the concept files
themselves stand on, is base/ (errors, options, processes, and the readers of checkpoint files).

    ckpt.py          our ckpt.pt: what it holds, atomic save, --resume, the tokenizer it carries,
                     the model class it names (load_reward_model)
    export_hf.py     a trained reward model as an HF LlamaForSequenceClassification directory
    score.py         score a response, or export (python -m nanorm.score)
    sample.py        generate text from any checkpoint (python -m nanorm.sample)
    cache.py         frozen bottom layers computed once per pair (--train_layers)
    lora.py          LoRA adapters (--lora_rank), merged into the checkpoint
    fsdp.py          sharding the model over the ranks (--fsdp)
    length_head.py   ODIN's length head (--length_head)
    subset_experts.py  a reward head per subset of the data, mixed by a gate (--subset_experts)
    calibrate.py     post-hoc length calibration and reward normalization
    rl.py            the reward model in use: the PPO and GRPO loop (python -m nanorm.rl)
    report.py        what an evaluation reports: accuracy against length heuristics, plots
    build.py         the data, model and optimizer a train_rm.py run builds from its flags
    run_dir.py       a run's folder: the claim and lock, log.jsonl and its loggers, the plots
    base/            the ground floor (see base/__init__.py)

Floors, bottom to top: base/ (with model.py, which imports nothing); data/ and the concept files
(reward.py, critic.py, verifiable.py); the attic here; the scripts (train_rm.py, eval_rm.py).
A module imports only its own floor or those below it, at the top of the file or inside a
function; a feature behind a flag is imported where its flag is handled.
Scripts here run as modules from the project root: `python -m nanorm.score --help`.
"""
