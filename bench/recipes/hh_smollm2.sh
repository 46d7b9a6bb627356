#!/usr/bin/env bash
# SmolLM2-135M-Instruct -> ONE reward model for all four shared HH-RLHF subsets, on a 2-core CPU.
#
#   bash bench/recipes/hh_smollm2.sh                       # reads ../shared/data, writes out/hh-smollm2/
#   /usr/bin/time -v bash bench/recipes/hh_smollm2.sh      # with its wall time and peak memory
#   GGUF=path/to/SmolLM2-135M-Instruct.Q4_1.gguf HH=path/to/hh-rlhf bash bench/recipes/hh_smollm2.sh
#   SEED=2 OUT=out/hh-h2 bash bench/recipes/hh_smollm2.sh  # row H, another seed, reuses the cache
#   LR=4e-4 OUT=out/hh-i bash bench/recipes/hh_smollm2.sh  # row I
#   LR=1e-4 OUT=out/hh-f bash bench/recipes/hh_smollm2.sh  # row F
#   LR=1e-4 EXPERTS=false EPOCHS=2 CALIBRATE=true OUT=out/hh-d bash bench/recipes/hh_smollm2.sh  # D
#   MAX_TRAIN=800 DATA=data/hh_rlhf/smollm2-hh-800 LR=3e-5 HEAD_LR=0 DTYPE=float32 \
#       EXPERTS=false EPOCHS=2 CALIBRATE=true bash bench/recipes/hh_smollm2.sh   # row A (fp32)
#
# The defaults are the best row measured so far (H in README.md: --subset_experts, one epoch,
# lr 2e-4).
#
# Configurations measured so far, and what each buys: bench/recipes/README.md.
#
# Without the shared data: HH-RLHF's files are at
#   https://huggingface.co/datasets/Anthropic/hh-rlhf (<subset>/test.jsonl.gz, train.jsonl.gz)
# and any SmolLM2-135M-Instruct .gguf (F32/F16/BF16/Q8_0/Q4_0/Q4_1 tensors) or Hugging Face
# directory (config.json + model.safetensors + tokenizer.json) works as GGUF=...
#
#   1. prepare.py renders all four subsets' pairs (8,552) in SmolLM2's ChatML layout with its own
#      byte-level BPE vocabulary (read from the .gguf), the reward read at the <|im_end|> that
#      ends the response, holds out a fixed, seeded 20% of EACH subset (1,699 pairs), and keeps
#      MAX_TRAIN of each subset's other pairs to train on (all of them: MAX_TRAIN=100000).
#   2. train_rm.py trains the top LAYERS of SmolLM2's 30 layers and the heads, one model on the
#      union of the four training parts, for EPOCHS passes. EXPERTS=true (--subset_experts): a
#      shared head plus one head per subset, mixed by a gate taught each pair's subset, so one
#      model holds harmless-base's taste beside the helpful subsets' (nanorm/subset_experts.py).
#      The bottom layers are frozen: their output is computed once per pair and cached on disk
#      (cache.py, in the dataset's cache/ folder; a second run with the same data and checkpoint
#      reuses it), so a pass costs the top layers only. Each pair is one packed row
#      [prompt | chosen | rejected].
#      DTYPE=auto (the default) computes the cache and the trained layers under bf16 autocast
#      where the CPU multiplies bf16 natively (AVX512-BF16 or AMX: 1.75x the cache's pairs/s on
#      a Zen 4 EPYC), fp32 elsewhere; the weights, head, loss and reward differences stay fp32.
#   3. The held-out pairs of every subset are scored at each epoch's end; the last evaluation
#      writes OUT/eval.json (per subset) and its plots, and the summary below.
#   4. CALIBRATE=true (--calibrate_length): the line of reward on log(response tokens) is fitted
#      on the training pairs' rewards and stored in ckpt.pt (score.py and eval_rm.py serve r - it);
#      OUT/calibrated/eval.json is the held-out report of the calibrated rewards.
set -euo pipefail
cd "$(dirname "$0")/../.."
GGUF=${GGUF:-../shared/data/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf}
HH=${HH:-../shared/data/hh-rlhf}
OUT=${OUT:-out/hh-smollm2}
DATA=${DATA:-data/hh_rlhf/smollm2-hh-all}  # another MAX_TRAIN needs another DATA
LAYERS=${LAYERS:-4}
EPOCHS=${EPOCHS:-1}
LR=${LR:-2e-4}
HEAD_LR=${HEAD_LR:-3e-3}
DTYPE=${DTYPE:-auto}  # bf16 where the CPU has native bf16 (nanorm/base/runtime.auto_dtype), else fp32
BATCH=${BATCH:-8}
MAX_LEN=${MAX_LEN:-320}
MAX_TRAIN=${MAX_TRAIN:-100000}  # training pairs per subset: all of them (6,806 in all)
CALIBRATE=${CALIBRATE:-false}  # true: also fit the length calibration (calibrate.py), ~3 min
EXPERTS=${EXPERTS:-true}    # a reward head per subset, mixed by a gate (nanorm/subset_experts.py)
BALANCE=${BALANCE:-none}    # sampling: none, length, subset, subset+length (data/pairs.py)
EXTRA=${EXTRA:-}            # e.g. EXTRA="--length_head --length_coef 0.03" (ODIN, length_head.py)

if [ ! -f "$DATA/meta.json" ]; then  # prepared once; later runs (other settings) reuse it
    python data/hh_rlhf/prepare.py --src "$HH" --tokenizer "$GGUF" --max_len "$MAX_LEN" \
        --max_train "$MAX_TRAIN" --out_dir "$DATA"
fi
python train_rm.py --init "$GGUF" --dataset "$DATA" --out_dir "$OUT" --overwrite \
    --lm_coef 0 --pack --dtype "$DTYPE" --train_layers "$LAYERS" --batch_size "$BATCH" \
    --epochs "$EPOCHS" \
    --lr "$LR" --min_lr "$(python -c "print($LR / 10)")" --head_lr "$HEAD_LR" --warmup 20 \
    --weight_decay 0 --eval_first false --eval_interval 100000 --eval_pairs 100000 \
    --log_interval 50 --calibrate_length "$CALIBRATE" \
    --balance "$BALANCE" --seed "${SEED:-1337}" --subset_experts "$EXPERTS" $EXTRA
python - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
print(f"{'model':11s} {'subset':26s} {'n':>5s} {'acc':>6s} {'longer':>7s} {'len_bal':>7s} "
      f"{'acc_long':>8s} {'acc_short':>9s} {'len_corr':>8s}")
for model, path in (("as trained", "eval.json"), ("calibrated", "calibrated/eval.json")):
    if not os.path.exists(f"{out}/{path}"):
        continue
    res = json.load(open(f"{out}/{path}"))
    for s, m in {**res["subsets"], "overall": res["overall"]}.items():
        num = lambda k, f: format(m[k], f) if m.get(k) is not None else "n/a"
        print(f"{model:11s} {s:26s} {m['n']:5d} {m['accuracy']:6.3f} {m['longer_wins']:7.3f} "
              f"{num('length_balanced_accuracy', '7.3f'):>7s} {num('acc_chosen_longer', '8.3f'):>8s} "
              f"{num('acc_chosen_shorter', '9.3f'):>9s} {num('length_corr', '+8.3f'):>8s}")
PY
