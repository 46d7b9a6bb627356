"""
nanorm: what the concept files at the top (model.py, reward.py, critic.py, verifiable.py,
train_rm.py, eval_rm.py, data/) lean on, one concept per file. A first reading can skip it all.

    ckpt.py          our ckpt.pt: what it holds, atomic save, --resume, the tokenizer it carries,
                     the model class it names (load_reward_model)
    checkpoints.py   every checkpoint read (llama2.c .bin/.pt, Meta, HF, ColossalChat, .gguf,
                     ours) into a Transformer and named head tensors: load, load_transformer
    gguf_reader.py   llama.cpp's GGUF format: metadata, tensors, dequantization
    export_hf.py     a trained reward model as an HF LlamaForSequenceClassification directory
    score.py         score a response, or export (python -m nanorm.score)
    sample.py        generate text from any checkpoint (python -m nanorm.sample)
    cache.py         frozen bottom layers computed once per pair (--train_layers)
    lora.py          LoRA adapters (--lora_rank), merged into the checkpoint
    fsdp.py          sharding the model over the ranks (--fsdp)
    length_head.py   ODIN's length head (--length_head)
    subset_experts.py  a reward head per subset of the data, mixed by a gate (--subset_experts)
    calibrate.py     post-hoc length calibration and reward normalization
    rl.py            the reward model in use: PPO with the critic, GRPO with the verifier
                     (python -m nanorm.rl)
    report.py        what an evaluation reports: accuracy against length heuristics, plots
    build.py         the data, model and optimizer a train_rm.py run builds from its flags
    run_dir.py       a run's folder: the claim and lock, log.jsonl and its loggers, the plots
    runtime.py       who this process is: processes under torchrun, device, dtype, speed
    cli.py           options as a dataclass, checked; devices
    algebra/         the exact algebra verifiable.py compares answers with (pure Python)

Imports go one way: these files import the concept files, never the reverse, except the
readers of checkpoint files (checkpoints.py, gguf_reader.py), which stand on model.py alone:
reward.py builds its models on checkpoints.load, and ckpt.py, above the heads, on reward.py.
data/ reaches in here only where a file format is read (a .gguf tokenizer), inside that
function; the scripts (train_rm.py, eval_rm.py) import at the top what every run of theirs uses,
and a feature behind a flag where its flag is handled; verifiable.py's algebra is its own
subfolder, imported by it alone.
Scripts here run as modules from the project root: `python -m nanorm.score --help`.
"""
