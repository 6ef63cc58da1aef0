#!/usr/bin/env bash
# The prepared GPU campaign on the lent GPU machine (docs/gpu.md, "A GPU campaign"): install the carried wheels offline
# (as bench/gpu_check.sh does: a carried wheel that does not import is dropped, the machine's own copy used), then run
# bench/gpu_campaign.py with its output teed into $OUT. Arguments go to gpu_campaign.py.
#   bash bench/gpu_campaign.sh --check-part 1   the first call: part 1 of the GGUF arrived whole (it stays there)
#   bash bench/gpu_campaign.sh                  the second call: join the parts, run the chain, pack the tarball
set -u -o pipefail
OUT=${OUT:-gpu_campaign_out}; mkdir -p "$OUT"; LOG="$OUT/gpu_campaign.log"
if ! ls .whl/*.whl >/dev/null 2>&1; then
  echo "no .whl/: carry it (call 1) or run make gpu-campaign here first; on a fresh machine start again at call 1" | tee -a "$LOG"
  exit 2
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tee -a "$LOG" || exit 1
export PYTHONPATH=/tmp/site TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
for m in transformers peft datasets rouge_score gguf; do
  if ! python3 -c "import $m" >>"$LOG" 2>&1; then
    echo "import $m failed with the carried wheel (see above): removing it, the machine's own copy (if any) is used" | tee -a "$LOG"
    rm -rf "/tmp/site/$m" /tmp/site/"$m"-*.dist-info
  fi
done

PYTHONUNBUFFERED=1 python3 bench/gpu_campaign.py --out "$OUT" "$@" 2>&1 | tee -a "$LOG"
