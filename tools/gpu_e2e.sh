#!/bin/bash
# One configuration end to end on the GPU next to the CPU, through the CLI (issue 23): calibrate
# the tiny teacher on both devices, convert a DO-ACP x WC student from each stats file, and compare
# what a user sees: the selected experts and groups (moe2dense.json), the students' PPL on both
# devices. Run by tools/gpu_run.sh with M2D_BIN, M2D_MODELS, M2D_DATA set; prints one line per check.
set -u
bin=$M2D_BIN; teacher=$M2D_MODELS/tiny-qwen3moe; wiki=$M2D_DATA/wikitext-2-raw/wikitext-2-raw
w=${TMPDIR:-/tmp}/m2d-gpu-e2e; rm -rf "$w"; mkdir -p "$w"
rc=0
for dev in cpu cuda; do
  t0=$(date +%s%N)
  "$bin" calibrate --model "$teacher" --data "$wiki/wiki.valid.raw" --out "$w/$dev.stats" --seq-len 256 --samples 16 \
    --device "$dev" > "$w/$dev.calib.log" 2>&1 || { echo "calibrate --device $dev failed: $(tail -1 "$w/$dev.calib.log")"; rc=1; continue; }
  echo "calibrate --device $dev: $(head -1 "$w/$dev.calib.log") (wall $(( ($(date +%s%N) - t0) / 1000000 )) ms)"
  "$bin" convert --model "$teacher" --stats "$w/$dev.stats" --scoring do-acp --grouping wc --scaling avg-cp -K 16 \
    --out "$w/$dev.student" > "$w/$dev.convert.log" 2>&1 || { echo "convert from the $dev stats failed: $(tail -1 "$w/$dev.convert.log")"; rc=1; }
done
# the selection and grouping the two stats files lead to (hashes and timings apart)
# the selection and grouping the two stats files lead to (exact decisions), and how far the scores moved
sel() { python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); print(json.dumps([[L["selected"], L["groups"]] for L in d["layers"]]))' "$1"; }
if [ -f "$w/cpu.student/moe2dense.json" ] && [ -f "$w/cuda.student/moe2dense.json" ]; then
  # each read must succeed: two failed reads would compare equal
  if ! sc=$(sel "$w/cpu.student/moe2dense.json") || ! sg=$(sel "$w/cuda.student/moe2dense.json") || [ -z "$sc" ]; then
    echo "selected experts and groups: cannot be read from moe2dense.json"; rc=1
  elif [ "$sc" = "$sg" ]; then
    echo "selected experts and groups: identical from the cpu and cuda stats"
  else
    echo "selected experts and groups: DIFFER"; rc=1
  fi
  python3 -c 'import json,sys
a,b=[json.load(open(p))["layers"] for p in sys.argv[1:3]]
r=max(abs(x-y)/max(abs(y),1e-300) for la,lb in zip(a,b) for x,y in zip(la["scores"],lb["scores"]))
print("DO-ACP scores, cuda vs cpu stats: max relative difference %.3g" % r)' "$w/cuda.student/moe2dense.json" "$w/cpu.student/moe2dense.json"
fi
# each model's PPL in fp32 on the cpu, on cuda (its default kernels), on cuda with the 3xTF32
# attention (attn_kernel 2, the default before the 3xFP16 one) and with the two-pass log-sum-exp
# (M2D_CUDA_LSE=0, the reference; one pass is the default): within 1e-4 of the cpu's (what
# test_ppl allows the two devices); then in bf16 on the cpu, on cuda (the MoE's experts by k_gx)
# and on cuda with the WMMA grouped kernel (M2D_CUDA_MOE=1): within 1e-3 of the cpu's bf16 PPL
# (each side rounds activations to bf16 after sums in another order: test_engine's golden puts
# bf16 within 8.6e-5 of fp32 in mean NLL, so two bf16 runs within ~2e-4 of it, ~1e-3 of the PPL);
# then bf16 GEMMs with attention on bf16 operands (--attention bf16: k_attention_b16 on cuda)
# likewise within 1e-3 of the cpu's (both round the same operands and numerators)
for m in "$teacher" "$w/cpu.student"; do
  for run in cpu cuda cuda-attn2 cuda-lse0 cpu-bf16 cuda-bf16 cuda-bf16-moe1 cpu-bf16a cuda-bf16a; do
    dev=${run%%-*} prec=fp32 env= attn=fp32
    case $run in
      *-bf16a) prec=bf16 attn=bf16 ;;
      *-attn2) env=M2D_CUDA_ATTN=2 ;;
      *-lse0) env=M2D_CUDA_LSE=0 ;;
      *-bf16-moe1) prec=bf16 env=M2D_CUDA_MOE=1 ;;
      *-bf16) prec=bf16 ;;
    esac
    [ "$run" = cpu ] && ref= tol=1e-4
    [ "$run" = cpu-bf16 ] || [ "$run" = cpu-bf16a ] && ref= tol=1e-3
    if out=$(env $env "$bin" ppl --model "$m" --data "$wiki/wiki.test.raw" --seq-len 512 --max-windows 8 \
               --device "$dev" --precision "$prec" --attention "$attn" --json 2>&1); then
      p=$(printf '%s' "$out" | python3 -c 'import json,sys; print("%.9g" % json.loads(sys.stdin.read())["ppl"])')
      [ -z "$ref" ] && ref=$p
      printf 'ppl %-14s %-40s %s' "$run" "$(printf '%s' "$m" | tail -c 40)" "$p"
      python3 -c 'import sys; d=abs(float(sys.argv[1])/float(sys.argv[2])-1); print("  (vs %s %.3g)" % (sys.argv[4], d)); sys.exit(d >= float(sys.argv[3]))' \
        "$p" "$ref" "$tol" "$(case $prec$attn in bf16bf16) echo cpu-bf16a ;; bf16*) echo cpu-bf16 ;; *) echo cpu ;; esac)" || rc=1
    else
      echo "ppl $run $m failed: $out"; rc=1
    fi
  done
done

# make demo's grid (280 configurations, then its 3 distillations) on each device from the bundle's
# copy of the data, and the two results CSVs against each other: every configuration's PPL, the
# report's best-per-cell choices
if [ -f "${M2D_BUNDLE_ROOT:-}/experiments.toml" ]; then
  # the CPU's grid comes with the bundle (made by tools/gpu_bundle.sh on the build machine, fp32,
  # so any CPU's within the 1e-4 compared below): the GPU machine's minutes go to the GPU, and the
  # GPU's grid calibrates on the GPU (the sweep's calibration cache has one entry whichever device
  # made it, so a CPU sweep run here first would hand it its statistics); M2D_E2E_CPU=1 runs the
  # CPU's here again
  pre=$M2D_BUNDLE_ROOT/e2e/demo-cpu.csv
  for dev in cpu cuda; do
    t0=$(date +%s%N)
    if [ "$dev" = cpu ] && [ -f "$pre" ] && [ "${M2D_E2E_CPU:-0}" != 1 ]; then
      cp "$pre" "$w/demo-cpu.csv"
      echo "demo sweep --device cpu: made with the bundle ($(cat "$M2D_BUNDLE_ROOT/e2e/made-on.txt" 2>/dev/null))"
    else
      (cd "$M2D_BUNDLE_ROOT" && "$bin" sweep experiments.toml --experiment demo --set model=models/tiny-qwen3moe \
         --out "$w/demo-$dev.csv" --device "$dev" > "$w/demo-$dev.log" 2>&1) ||
        { echo "demo sweep --device $dev failed: $(tail -2 "$w/demo-$dev.log")"; rc=1; continue; }
      echo "demo sweep --device $dev: $(grep -m1 'wall' "$w/demo-$dev.log") ($(( ($(date +%s%N) - t0) / 1000000 )) ms)"
    fi
    "$bin" report "$w/demo-$dev.csv" --out "$w/demo-$dev.md" >/dev/null 2>&1 || rc=1
  done
  if [ -f "$w/demo-cpu.csv" ] && [ -f "$w/demo-cuda.csv" ]; then
    python3 - "$w/demo-cpu.csv" "$w/demo-cuda.csv" <<'PY' || rc=1
import csv, math, sys
def rows(p):
    with open(p) as f:
        return {r["config_id"]: r for r in csv.DictReader(l for l in f if not l.startswith("#"))}
a, b = rows(sys.argv[1]), rows(sys.argv[2])
worst, n = 0.0, 0
for k, ra in a.items():
    x, y = ra.get("ppl", ""), b.get(k, {}).get("ppl", "")
    if x in ("", "nan") or y in ("", "nan"):
        continue
    worst, n = max(worst, abs(float(x) / float(y) - 1)), n + 1
print("demo grid: %d configurations' PPL on cuda vs cpu: max relative difference %.3g" % (n, worst))
# the distilled students (the student trains on the device too: its fp32 GEMMs and sums in
# another order, 8 AdamW steps): their PPL and final loss within the same 1e-4
dworst, dn = 0.0, 0
for k, ra in a.items():
    for col in ("distill_ppl", "distill_final_loss"):
        x, y = ra.get(col, ""), b.get(k, {}).get(col, "")
        if x in ("", "nan"):
            continue
        d = abs(float(x) / float(y) - 1) if y not in ("", "nan") else math.inf
        dworst, dn = max(dworst, d), dn + 1
print("demo distillations: %d values (PPL, final loss) on cuda vs cpu: max relative difference %.3g" % (dn, dworst))
sys.exit(0 if n == len(a) and worst < 1e-4 and dn >= 6 and dworst < 1e-4 else 1)
PY
    if diff <(grep '^|' "$w/demo-cpu.md") <(grep '^|' "$w/demo-cuda.md") >/dev/null; then
      echo "demo report tables: identical on cpu and cuda"
    else
      echo "demo report tables: differ:"; diff <(grep '^|' "$w/demo-cpu.md") <(grep '^|' "$w/demo-cuda.md") | head -8
    fi
  fi
fi
exit $rc
