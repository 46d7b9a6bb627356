#!/usr/bin/env bash
# The runs of bench/rl/README.md: PPO against a learned proxy (two proxies, two KL
# coefficients) and GRPO against the verifier, five seeds each, then the table and the figure.
#   bash bench/rl/run.sh              # from the repository root; about 25 min of one CPU core
#   bash bench/rl/run.sh 1            # only the seed-1 runs
# The SFT policy and the proxies are trained once, into out/rl_cache, and reused by every run.
set -euo pipefail
cd "$(dirname "$0")/../.."
# On another CPU (other kernels, sums in another order) each run differs in detail: bench/rl/README.md
# says what held across the seeds, which is what a claim may rest on.
run() {
    local name=$1
    shift
    python -m nanorm.rl --cache_dir out/rl_cache --out_dir "out/rl/$name" "$@" | grep -v "^step [0-9]*/"
    cp "out/rl/$name/rl.jsonl" "bench/rl/$name.jsonl"
}
for seed in ${@:-0 1 2 3 4}; do
    run "ppo_proxy5000_kl0.02_seed$seed" --algo ppo --reward proxy --kl_coef 0.02 --seed $seed
    run "ppo_proxy5000_kl0.1_seed$seed" --algo ppo --reward proxy --kl_coef 0.1 --seed $seed
    run "ppo_proxy1000_kl0.02_seed$seed" --algo ppo --reward proxy --kl_coef 0.02 --seed $seed \
        --proxy_pairs 1000
    run "grpo_verifier_kl0.02_seed$seed" --algo grpo --reward verifier --kl_coef 0.02 --seed $seed
done
python bench/rl/report.py
