#!/usr/bin/env bash
# The prepared GPU check on the lent GPU machine (docs/gpu.md): install the carried wheels offline, check that each
# imports against the machine's own packages (a carried wheel that does not is dropped, and the machine's copy used),
# then run bench/gpu_check.py with its output teed into $OUT. Arguments go to gpu_check.py.
set -u -o pipefail
OUT=${OUT:-gpu_check_out}; mkdir -p "$OUT"; LOG="$OUT/gpu_check.log"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tee -a "$LOG" || exit 1
export PYTHONPATH=/tmp/site TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
for m in transformers peft datasets rouge_score; do
  if ! python3 -c "import $m" >>"$LOG" 2>&1; then
    echo "import $m failed with the carried wheel (see above): removing it, the machine's own copy (if any) is used" | tee -a "$LOG"
    rm -rf "/tmp/site/$m" /tmp/site/"$m"-*.dist-info
  fi
done

PYTHONUNBUFFERED=1 python3 bench/gpu_check.py --out "$OUT" "$@" 2>&1 | tee -a "$LOG"
