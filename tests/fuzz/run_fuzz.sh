#!/usr/bin/env bash
# `make fuzz`: builds the libFuzzer harnesses tests/fuzz/fuzz_*.c with clang-14
# (-fsanitize=fuzzer,address,undefined, the library sources compiled directly,
# not the gcc-built libk3.a) and runs each one for FUZZ_SECONDS (default 60).
# Seeds come from tests/fuzz/seeds/<target>/ (read only); new inputs go to the
# ignored tests/fuzz/corpus-work/<target>/, crash/leak/timeout reproducers to
# tests/fuzz/corpus-work/crashes/. Exit status is non-zero if any target failed.
#   FUZZ_SECONDS=N     seconds per target (default 60)
#   FUZZ_TARGETS="a b" targets to run (default: safetensors checkpoint config state openai chat_parse tokenizer wire ring)
#   FUZZ_JOBS=N        parallel libFuzzer workers per target (default 1)
#   CLANG=path         compiler (default clang-14, else clang)
#   Replay one input:  build/fuzz/fuzz_config FILE
set -u
cd "$(dirname "$0")/../.."
SECONDS_PER="${FUZZ_SECONDS:-60}"
TARGETS="${FUZZ_TARGETS:-safetensors checkpoint config state openai chat_parse tokenizer wire ring}"
JOBS="${FUZZ_JOBS:-1}"
CLANG="${CLANG:-$(command -v clang-14 || command -v clang)}"
OUT=build/fuzz
WORK=tests/fuzz/corpus-work
if [ -z "$CLANG" ]; then echo "run_fuzz.sh: clang-14 not found" >&2; exit 1; fi
mkdir -p "$OUT" "$WORK/crashes"

CFLAGS=(-std=gnu11 -g -O1 -I. -fno-omit-frame-pointer -ffp-contract=off
        -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
        -Wall -Wextra -Wshadow -Wpointer-arith -Wvla -Werror)
# library sources each harness needs (compiled directly with the sanitizers)
sources_for() {
  case "$1" in
    safetensors) echo common/safetensors.c common/file_read.c common/error.c ;;
    checkpoint)  echo common/checkpoint.c common/safetensors.c common/direct_read.c common/file_read.c common/error.c ;;
    config)      echo common/config.c common/file_read.c common/error.c ;;
    state)       echo coordinator/state_file.c coordinator/state.c coordinator/sampler.c common/hash64.c \
                      common/config.c common/error.c common/file_read.c ;;
    openai)      echo coordinator/openai_api.c coordinator/xtml.c coordinator/chat.c coordinator/tokenizer.c \
                      coordinator/unicode_classes.c coordinator/sampler.c common/error.c common/file_read.c ;;
    chat_parse)  echo coordinator/chat_parse.c coordinator/xtml.c coordinator/chat.c coordinator/tokenizer.c \
                      coordinator/unicode_classes.c coordinator/sampler.c common/error.c common/file_read.c ;;
    tokenizer)   echo coordinator/tokenizer.c coordinator/unicode_classes.c common/error.c common/file_read.c ;;
    wire)        echo common/wire.c common/error.c ;;
    ring)        echo common/ring.c common/wire.c common/error.c ;;
    *) echo "run_fuzz.sh: unknown target '$1'" >&2; return 1 ;;
  esac
}

fail=0
for t in $TARGETS; do
  srcs=$(sources_for "$t") || { fail=1; continue; }
  bin="$OUT/fuzz_$t"
  echo "== building $bin"
  # shellcheck disable=SC2086
  if ! "$CLANG" "${CFLAGS[@]}" -o "$bin" "tests/fuzz/fuzz_$t.c" $srcs -ljansson -lmsgpackc -lrt -lpthread -lm; then
    echo "FAIL build fuzz_$t"; fail=1; continue
  fi
  mkdir -p "$WORK/$t"
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  par=()
  [ "$JOBS" -gt 1 ] && par=(-fork="$JOBS")
  echo "== fuzzing $t for ${SECONDS_PER}s (corpus $WORK/$t, seeds tests/fuzz/seeds/$t)"
  log="$OUT/fuzz_$t.log"
  ASAN_OPTIONS="detect_leaks=1:abort_on_error=0" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  "$bin" "$WORK/$t" "tests/fuzz/seeds/$t" "${dict[@]}" "${par[@]}" \
      -max_total_time="$SECONDS_PER" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
      -print_final_stats=1 -artifact_prefix="$WORK/crashes/$t-" >"$log" 2>&1
  rc=$?
  grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ +DONE)' "$log" | tr '\n' ' '; echo
  if [ $rc -ne 0 ]; then
    echo "FAIL fuzz_$t (exit $rc): see $log; reproducers:"; ls "$WORK/crashes" | grep "^$t-" | sed 's/^/  /'
    grep -E 'ERROR:|runtime error|broken promise|SUMMARY' "$log" | head -n 5
    fail=1
  else
    echo "PASS fuzz_$t: corpus $(ls "$WORK/$t" | wc -l) files"
  fi
done
exit $fail
