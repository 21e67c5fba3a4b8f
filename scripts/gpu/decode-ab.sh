#!/usr/bin/env bash
# Decode ms/token under several environment settings, alternating in one process tree so
# that the shared GPU's drift hits every setting alike (binaries from scripts/gpu/bundle.sh).
# Each setting is a space-separated list of VAR=VALUE (or "-" for none); every round runs
# each setting once (affinity-bench's own median of 3 runs) and the script prints every
# round's value and the median per setting.
#
#   BIN_DIR=.devpack scripts/gpu/decode-ab.sh ROUNDS SETTING... [-- BENCH_ARGS...]
#   e.g. ... 2 - AFF_CUDA_L2_AHEAD=0 "AFF_CUDA_SHARED_SMS=33 AFF_CUDA_L2_AHEAD=0"
#   or, what each stage adds to the step: ... 1 - AFF_CUDA_ABLATE=mhc AFF_CUDA_ABLATE=wo_a,wo_b
#   (AFF_CUDA_ABLATE leaves the named stages out; runtime/profile.h lists them)
# Default bench arguments: the issue-5 decode geometry at context 4096. BENCH replaces the
# bench command (the script's own check uses a stand-in).
set -uo pipefail
bin=$(cd "${BIN_DIR:?set BIN_DIR to a bundle made by scripts/gpu/bundle.sh}" && pwd)
rounds=${1:?rounds}
shift
settings=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do settings+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--layers 43 --kv-size 65536 --expert-types Q2_K,Q3_K --contexts 4096 --prefill none
                               --decode-steps 32)
[ ${#settings[@]} -gt 0 ] || { echo "decode-ab: no settings given" >&2; exit 2; }
bench=${BENCH:-"$bin/run affinity-bench"}
$bench --help > /dev/null 2>&1  # unpacks the binary outside the timed runs
declare -A values
for ((r = 1; r <= rounds; ++r)); do
    for s in "${settings[@]}"; do
        envs=()
        [ "$s" != - ] && read -r -a envs <<< "$s"
        # The table's first row (the first context) holds the median ms/token.
        # ... and, last, the digest of the run's tokens and logits (equal digests: equal numbers).
        row=$(env "${envs[@]}" $bench "${args[@]}" 2>/dev/null | awk '/^ *context/ {getline; print $2, $NF; exit}')
        v=${row%% *} dg=${row##* }
        [ -n "$v" ] || v=failed dg=-
        echo "round $r  [$s]  $v ms/token  digest $dg"
        values[$s]="${values[$s]:-} $v"
    done
done
echo
for s in "${settings[@]}"; do
    med=$(tr ' ' '\n' <<< "${values[$s]}" | grep -E '^[0-9.]+$' | sort -g | awk '{a[NR]=$1} END {if (NR) print (NR % 2 ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2); else print "none"}')
    echo "median [$s]: $med ms/token"
done
