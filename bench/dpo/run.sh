#!/usr/bin/env bash
# The runs of bench/dpo/README.md: DPO's implicit reward against explicit reward models trained
# on the same 5,000 pairs with the same steps, batch and starting weights (the SFT policy), three
# seeds; then every model scored on the held-out pairs and two shifted sets, and the tables.
#   bash bench/dpo/run.sh          # from the repository root (a fresh clone too): under 10 min
#   bash bench/dpo/run.sh 0        # only the seed-0 runs
# Everything it trains goes to out/dpo_bench; scores.jsonl and time.json are written here.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1 # one core: the model is 0.2M parameters
OUT=out/dpo_bench
STEPS=150
BATCH=32
PAIRS=5000
start=$(date +%s)
python -c "from data.arith.prepare import built_in; built_in()" >/dev/null # if missing
# held-out sets away from training, in the built-in tokenizer: numbers up to 99 (training's
# stop at 9), and multiplication (training asks + and -)
python data/arith/prepare.py --out_dir $OUT/long --max_operand 99 --n_val 1000 --n_train 1 \
    --tokenizer data/arith/tok.model --seed 1 >/dev/null
python data/arith/prepare.py --out_dir $OUT/mul --ops "*" --n_val 1000 --n_train 1 \
    --tokenizer data/arith/tok.model --seed 1 >/dev/null
# the first 5,000 training pairs as a dataset folder for train_rm.py (nanorm.dpo: --pairs)
[ -f $OUT/pairs$PAIRS/meta.json ] ||
    python -c "from nanorm.rl import subset_of; subset_of('data/arith', '$OUT/pairs$PAIRS', $PAIRS)"
same="--max_iters $STEPS --batch_size $BATCH --dataset $OUT/pairs$PAIRS --init $OUT/cache/sft400_policy.pt"
same="$same --warmup 20 --eval_interval $STEPS --eval_first false --eval_pairs 100 --dtype float32"
same="$same --device cpu --overwrite true --log_interval 100"
for seed in ${@:-0 1 2}; do
    # DPO first: it trains the SFT policy into the cache the first time, which the RMs start from
    python -m nanorm.dpo --cache_dir $OUT/cache --out_dir $OUT/dpo_seed$seed --seed $seed \
        --max_steps $STEPS --batch_size $BATCH --pairs $PAIRS --log_interval 100
    python train_rm.py $same --lm_coef 0 --seed $seed --out_dir $OUT/rm_seed$seed | tail -1
    python train_rm.py $same --lm_coef 1 --seed $seed --out_dir $OUT/rm_lm_seed$seed | tail -1
done
python bench/dpo/score.py $OUT ${@:-0 1 2}
echo "{\"seconds\": $(($(date +%s) - start)), \"seeds\": \"${*:-0 1 2}\"}" >bench/dpo/time.json
python bench/dpo/report.py
