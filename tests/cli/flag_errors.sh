#!/usr/bin/env bash
# A bad flag value names the command that was run: profile and simulate read their settings with
# train's parser (presets, flags, --config files, the whole-configuration check), and each error
# there starts with "[profile]" or "[simulate]" and points at that command's --help, never at
# "[train]"; train's own errors still say "[train]". Every case exits 1 before any work.
# Usage: flag_errors.sh HETRAIN
set -uo pipefail
bin=$1
bad=$(dirname "$0")/bad
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export XDG_CACHE_HOME="$tmp/cache"
fails=0

# expect COMMAND EXPECTED_TEXT ARGS...: `hetrain COMMAND ARGS...` exits 1, its error contains
# "[COMMAND] " and EXPECTED_TEXT, and no other command's tag or --help.
expect() {
  local cmd=$1 text=$2 out rc
  shift 2
  out=$(timeout 120 "$bin" "$cmd" "$@" 2>&1)
  rc=$?
  local why=""
  [ "$rc" = 1 ] || why="exit status $rc, not 1"
  grep -qF "[$cmd] " <<<"$out" || why="$why; no '[$cmd] '"
  grep -qF -- "$text" <<<"$out" || why="$why; no '$text'"
  for other in train profile simulate; do
    [ "$other" = "$cmd" ] && continue
    grep -qF "[$other]" <<<"$out" && why="$why; says '[$other]'"
    grep -qF "hetrain $other --help" <<<"$out" && why="$why; points at 'hetrain $other --help'"
  done
  if [ -n "$why" ]; then
    echo "FAIL: hetrain $cmd $*: ${why#; }"
    echo "  got: $out"
    fails=$((fails + 1))
  else
    echo "ok: hetrain $cmd $*: $out"
  fi
}

# profile: a flag value (training::apply_setting), a preset, a --config file, validate(), a
# mode of --sweep-recompute, and the flags and arguments of profile's own parser.
expect profile "flag --precision: precision must be fp32, bf16 or fp16, got 'xx'" --precision xx
expect profile "flag --recompute: recompute must be none, selective, full or auto, got 'often'" \
  --recompute often
expect profile "flag --memory-budget" --memory-budget lots
expect profile "flag --seed: seed must be >= 0, got -1" --seed -1
expect profile "flag --batch-size: 'batch-size' expects an integer, got 'many'" --batch-size many
expect profile "unknown preset 'nope'; known presets: fashion-mlp" --preset nope
expect profile "config $bad/lr_bool.toml: 'lr' must not be a boolean" --config "$bad/lr_bool.toml"
printf 'lerning-rate = 1\n' > "$tmp/typo.toml"
expect profile "config $tmp/typo.toml: unknown setting 'lerning-rate'" --config "$tmp/typo.toml"
expect profile "batch-size must be positive, got 0" --batch-size 0 --steps 1
expect profile "flag --sweep-recompute: recompute must be none, selective, full or auto, got 'often'" \
  --sweep-layers 2 --sweep-recompute often --report "$tmp/d.svg"
expect profile "unexpected argument 'extra'; see 'hetrain profile --help'" extra
expect profile "unknown flag '--loss'; see 'hetrain profile --help'" --loss foo

# simulate reads its model flags the same way.
expect simulate "flag --recompute: recompute must be none, selective, full or auto, got 'often'" \
  --recompute often
expect simulate "unknown preset 'nope'" --preset nope

# train keeps its own name.
expect train "flag --precision: precision must be fp32, bf16 or fp16, got 'xx'" --precision xx
expect train "unknown preset 'nope'; known presets: fashion-mlp" --preset nope
expect train "batch-size must be positive, got 0" --batch-size 0 --steps 1
expect train "unexpected argument 'extra'; see 'hetrain train --help'" extra
expect train "--loss must be cross-entropy, got 'foo'" --loss foo

[ "$fails" = 0 ] || { echo "$fails case(s) failed"; exit 1; }
echo "all cases passed"
