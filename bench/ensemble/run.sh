#!/usr/bin/env bash
# The runs of bench/ensemble/README.md: five proxies on disjoint 1,000-pair splits, best-of-N
# from the SFT policy under one member and the ensemble's rules, and PPO against one member
# (K = 1) and against the five under each rule, three seeds; then the tables and the figure.
#   bash bench/ensemble/run.sh          # from the repository root (a fresh clone too)
#   bash bench/ensemble/run.sh 0        # only the seed-0 runs
# Two processes at a time, one torch thread each (a 2-core machine). Everything it trains goes
# to out/ensemble; the runs' rl.jsonl, best_of_n_seed<N>.json and time.json are kept here.
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=1
CACHE=out/ensemble_cache
OUT=out/ensemble
SEEDS=${*:-0 1 2}
STEPS=${STEPS:-50}  # PPO steps
BATCH=${BATCH:-64}  # answers per PPO step
ITERS=${ITERS:-300} # train_rm.py steps per member
start=$(date +%s)
python -c "from data.arith.prepare import built_in; built_in()" >/dev/null # if missing
members="--cache_dir $CACHE --proxy_pairs 1000 --proxy_iters $ITERS"
prep() { python -m nanorm.ensemble --task prepare $members --member "$1" | tail -1; }
ppo() { # name, then nanorm.rl's options
    local name=$1
    shift
    python -m nanorm.rl $members --out_dir "$OUT/$name" --max_steps $STEPS --batch_size $BATCH \
        "$@" | tail -1
    cp "$OUT/$name/rl.jsonl" "bench/ensemble/$name.jsonl"
}
bon() {
    python -m nanorm.ensemble --task best_of_n $members --seed "$1" --out_dir "$OUT/bon_seed$1"
    cp "$OUT/bon_seed$1/best_of_n.json" "bench/ensemble/best_of_n_seed$1.json"
}
export -f prep ppo bon
export members OUT STEPS BATCH
# 1. the members, two at a time; member 0 first, the SFT policy after it (it takes its shape)
(prep 0 && prep 2) &
a=$!
(prep 1 && prep 3 && prep 4) &
b=$!
wait $a
wait $b
# 2. PPO and best-of-N, two at a time, the ensemble's runs first
jobs=()
for seed in $SEEDS; do
    for rule in mean min mean_minus_std; do
        jobs+=("ppo ppo_k5_${rule}_seed$seed --members 5 --rule $rule --seed $seed")
    done
done
for seed in $SEEDS; do
    jobs+=("ppo ppo_k1_seed$seed --members 1 --seed $seed" "bon $seed")
done
printf '%s\n' "${jobs[@]}" | xargs -P 2 -I{} bash -c "{}"
echo "{\"seconds\": $(($(date +%s) - start)), \"seeds\": \"$SEEDS\", \"steps\": $STEPS, \"batch\": $BATCH, \"member_iters\": $ITERS}" >bench/ensemble/time.json
python bench/ensemble/report.py
