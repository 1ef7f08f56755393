#!/usr/bin/env bash
# The f32 GEMM library a run takes: `hetrain bench` times oneDNN's and OpenBLAS's sgemm under
# the engine and stores the faster in the device profile; every later command takes it, and
# `hetrain version` says which and why. HETRAIN_SGEMM overrides (a value naming neither is an
# error); a profile without timings, or with a choice naming neither, leaves the built-in rule.
# The same for which f32 convolution kernels come first (HETRAIN_CONV_PATH=own|onednn), and for
# bf16 layers on oneDNN's bf16 kernels or converted to f32 (HETRAIN_BF16_GEMM=onednn|sgemm),
# where oneDNN has bf16 kernels for this CPU.
# Usage: gemm_choice.sh HETRAIN
set -euo pipefail
HT=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="$tmp/cache"
unset HETRAIN_SGEMM HETRAIN_CONV_PATH HETRAIN_BF16_GEMM
prof="$XDG_CACHE_HOME/hetrain/device_profile.json"
fail() {
  echo "FAIL: $*"
  exit 1
}
gemm_line() { "$HT" version | grep '^f32 GEMM: '; }

line=$(gemm_line)
grep -q "the built-in rule (no device profile at '$prof'; 'hetrain bench' times both)" <<<"$line" \
  || fail "no profile: $line"

"$HT" bench --quick > "$tmp/bench.out" 2>&1 || { cat "$tmp/bench.out"; fail "bench"; }
choice=$(python3 -c 'import json, sys
g = json.load(open(sys.argv[1]))["sgemm"]
assert g["onednn_s"] > 0 and g["openblas_s"] > 0, g
assert g["choice"] == ("openblas" if g["openblas_over_onednn"] < 1 else "onednn"), g
print(g["choice"])' "$prof") || fail "sgemm timings in the profile"
library() { [ "$1" = openblas ] && echo "OpenBLAS" || echo "oneDNN"; }
grep -Eq "$(library "$choice") .*\(taken\)" "$tmp/bench.out" || { cat "$tmp/bench.out"; fail "bench table"; }
line=$(gemm_line)
grep -q "^f32 GEMM: $(library "$choice") .*sgemm, the faster in this machine's device profile: $choice (OpenBLAS's time over oneDNN's on linear layers and attention: [0-9.]*, geometric mean)" <<<"$line" \
  || fail "after bench: $line"

# The other library stored as the choice: runs take it.
other=onednn
[ "$choice" = onednn ] && other=openblas
python3 -c 'import json, sys
j = json.load(open(sys.argv[1])); j["sgemm"]["choice"] = sys.argv[2]
json.dump(j, open(sys.argv[1], "w"))' "$prof" "$other"
line=$(gemm_line)
grep -q "^f32 GEMM: $(library "$other") .*device profile: $other " <<<"$line" || fail "edited: $line"

line=$(HETRAIN_SGEMM=$choice "$HT" version | grep '^f32 GEMM: ')
grep -q "^f32 GEMM: $(library "$choice") .*sgemm, set by HETRAIN_SGEMM" <<<"$line" || fail "env: $line"
if out=$(HETRAIN_SGEMM=mkl "$HT" version 2>&1); then fail "HETRAIN_SGEMM=mkl accepted: $out"; fi
grep -q "HETRAIN_SGEMM must be openblas or onednn, got 'mkl'" <<<"$out" || fail "env message: $out"

python3 -c 'import json, sys
j = json.load(open(sys.argv[1])); j["sgemm"]["choice"] = "mkl"
json.dump(j, open(sys.argv[1], "w"))' "$prof"
line=$(gemm_line)
grep -q "the built-in rule (device profile '$prof' is corrupt (field 'sgemm.choice' must be \"onednn\" or \"openblas\", got \"mkl\")" <<<"$line" \
  || fail "bad choice: $line"

# The convolution kernels: the same measurement, choice, override and refusal.
"$HT" bench --quick > "$tmp/bench.out" 2>&1 || { cat "$tmp/bench.out"; fail "bench again"; }
conv_line() { "$HT" version | grep '^f32 convolutions: '; }
conv=$(python3 -c 'import json, sys
g = json.load(open(sys.argv[1]))["conv"]
assert g["own_s"] > 0 and g["onednn_s"] > 0, g
assert g["choice"] == ("onednn" if g["own_over_onednn"] > 1 else "own"), g
print(g["choice"])' "$prof") || fail "conv timings in the profile"
kernels() { [ "$1" = own ] && echo "own Winograd/direct kernels" || echo "oneDNN"; }
grep -Eq "3x3 conv layers.*$(kernels "$conv") first \(taken\)" "$tmp/bench.out" \
  || { cat "$tmp/bench.out"; fail "bench table (conv)"; }
line=$(conv_line)
grep -q "^f32 convolutions: $(kernels "$conv") first, the faster in this machine's device profile: $conv (the own kernels' time over oneDNN's on 3x3 layers: [0-9.]*, geometric mean)" <<<"$line" \
  || fail "conv after bench: $line"
other=own
[ "$conv" = own ] && other=onednn
python3 -c 'import json, sys
j = json.load(open(sys.argv[1])); j["conv"]["choice"] = sys.argv[2]
json.dump(j, open(sys.argv[1], "w"))' "$prof" "$other"
line=$(conv_line)
grep -q "^f32 convolutions: $(kernels "$other") first, .*device profile: $other " <<<"$line" \
  || fail "conv edited: $line"
line=$(HETRAIN_CONV_PATH=$conv "$HT" version | grep '^f32 convolutions: ')
grep -q "^f32 convolutions: $(kernels "$conv") first, set by HETRAIN_CONV_PATH" <<<"$line" \
  || fail "conv env: $line"
if out=$(HETRAIN_CONV_PATH=cudnn "$HT" version 2>&1); then fail "HETRAIN_CONV_PATH=cudnn accepted: $out"; fi
grep -q "HETRAIN_CONV_PATH must be own or onednn, got 'cudnn'" <<<"$out" || fail "conv env message: $out"
python3 -c 'import json, sys
j = json.load(open(sys.argv[1])); j["conv"]["choice"] = "cudnn"
json.dump(j, open(sys.argv[1], "w"))' "$prof"
line=$(conv_line)
grep -q "^f32 convolutions: own Winograd/direct kernels first, the built-in rule (device profile '$prof' is corrupt (field 'conv.choice' must be \"own\" or \"onednn\", got \"cudnn\")" <<<"$line" \
  || fail "conv bad choice: $line"

# bf16 layers: measured only where oneDNN has bf16 kernels here.
"$HT" bench --quick > "$tmp/bench.out" 2>&1 || { cat "$tmp/bench.out"; fail "bench a third time"; }
bf16_line() { "$HT" version | grep '^bf16 GEMMs and convolutions: '; }
bf16=$(python3 -c 'import json, sys
g = json.load(open(sys.argv[1])).get("bf16_gemm", {})
if g.get("choice", "") == "":
    print("none")
else:
    assert g["onednn_s"] > 0 and g["f32_s"] > 0, g
    assert g["choice"] == ("sgemm" if g["f32_over_onednn"] < 1 else "onednn"), g
    print(g["choice"])' "$prof") || fail "bf16 timings in the profile"
if [ "$bf16" = none ]; then
  line=$(bf16_line)
  grep -q "^bf16 GEMMs and convolutions: converted to f32 (oneDNN has no bf16 kernels for this CPU)" <<<"$line" \
    || fail "no bf16 kernels: $line"
else
  path() { [ "$1" = onednn ] && echo "oneDNN bf16 kernels" || echo "converted to f32"; }
  grep -Eq "bf16 linear and conv layers.*$(path "$bf16") \(taken\)" "$tmp/bench.out" \
    || { cat "$tmp/bench.out"; fail "bench table (bf16)"; }
  line=$(bf16_line)
  grep -q "^bf16 GEMMs and convolutions: $(path "$bf16"), the faster in this machine's device profile: $bf16 (the time converted to f32 over oneDNN's bf16 kernels on bf16 layers: [0-9.]*, geometric mean)" <<<"$line" \
    || fail "bf16 after bench: $line"
  other=onednn
  [ "$bf16" = onednn ] && other=sgemm
  line=$(HETRAIN_BF16_GEMM=$other "$HT" version | grep '^bf16 GEMMs and convolutions: ')
  grep -q "^bf16 GEMMs and convolutions: $(path "$other"), set by HETRAIN_BF16_GEMM" <<<"$line" \
    || fail "bf16 env: $line"
  if out=$(HETRAIN_BF16_GEMM=amx "$HT" version 2>&1); then fail "HETRAIN_BF16_GEMM=amx accepted: $out"; fi
  grep -q "HETRAIN_BF16_GEMM must be onednn or sgemm, got 'amx'" <<<"$out" || fail "bf16 env message: $out"
fi
echo "f32 GEMM library: $choice, convolution kernels: $conv, bf16: $bf16; measured, taken, overridden and refused as they should be"
