# The one device call this branch waits on: tests/gpu's seesaw and narrow checks at its defaults, then decode_timeline
# at main (before) and here (after), two rounds alternating. The b1 x 128K case watches the long-sequence merge, whose
# kernel went from 80 to 91 registers (sm_90, ptxas). Before the call, in this checkout:
#   mkdir .ab-main && git archive main | tar -x -C .ab-main
# Run: bash benchmarks/mid_partials_check.sh
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
PYTHONPATH=. timeout 200 python3 -m pytest -q -m gpu tests/gpu -k "mla_seesaw or mla_narrow" 2>&1 | tail -3
CASES="mla16-b1x4K mla32-b1x4K mla64-b1x4K mla64-b1x1K mla16-b1x128K mla64-b8x550"
for r in 1 2; do
  (cd .ab-main && PYTHONPATH=. python3 benchmarks/decode_timeline.py --flush read --out $OUT/old$r $CASES \
    > $OUT/old$r.log 2>&1)
  PYTHONPATH=. python3 benchmarks/decode_timeline.py --flush read --out $OUT/new$r $CASES > $OUT/new$r.log 2>&1
done
for f in old1 new1 old2 new2; do echo "== $f"; grep -A6 "^case " $OUT/$f.log | cut -c1-60; done
