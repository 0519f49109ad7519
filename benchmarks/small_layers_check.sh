# The check this branch waits on, in one device call: tests/gpu's seesaw and narrow checks at the new defaults, then
# decode_timeline before (COMBINE_FEW_J 0, the seesaw at min_tiles 2) and after. Run: bash benchmarks/small_layers_check.sh
export PYTHONPATH=. PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m pytest -q -m gpu tests/gpu -k "mla_seesaw or mla_narrow" 2>&1 | tail -4
old() { python3 -c "import sys, runpy; from memcheck.kernels import work_split as w; w.COMBINE_FEW_J = 0; sys.argv = ['decode_timeline.py'] + sys.argv[1:]; runpy.run_path('benchmarks/decode_timeline.py', run_name='__main__')" "$@"; }
old --flush read --out $OUT/old16 mla16-b1x1K > $OUT/old16.log 2>&1
old --flush read --out $OUT/old3264 --config '{"min_tiles": 2}' mla32-b8x550 mla64-b1x1K mla64-b8x550 > $OUT/old3264.log 2>&1
python3 benchmarks/decode_timeline.py --flush read --out $OUT/new mla16-b1x1K mla32-b8x550 mla64-b1x1K mla64-b8x550 > $OUT/new.log 2>&1
for f in old16 old3264 new; do echo "== $f"; grep -A6 "^case " $OUT/$f.log | cut -c1-110; done
