#!/usr/bin/env bash
# luna-serve against luna-translate on the same checkpoint, sentences and threads:
#   throughput  N concurrent single-sentence clients (tools/bench/serve-load.py) vs luna-translate
#               on the whole file (its own length-sorted batches), interleaved ROUNDS times, medians
#   latency     one client sending the sentences one by one vs luna-translate --batch-size 1 (each
#               sentence decoded alone) and vs the decode time luna-serve measures for it
#
#   tools/bench/serve-vs-translate.sh CHECKPOINT SENTENCES [--clients 32] [--seconds 20]
#       [--rounds 3] [--threads 2] [--lines 400] [--latency-lines 40] [--build build]
#       [--workers 1] [--serve-threads N]   (luna-serve's --workers and --threads; default: 1 and
#                                            --threads, the threads luna-translate gets)
#
# Only 127.0.0.1; every run is bounded (--seconds per load run). Prints one table.
set -euo pipefail
usage() { sed -n '2,13p' "$0"; }
[ $# -ge 2 ] || { usage >&2; exit 2; }
ck="$1" input="$2"; shift 2
clients=32 seconds=20 rounds=3 threads=2 lines=400 latency_lines=40 build=build workers=1
serve_threads=
while [ $# -gt 0 ]; do
  case "$1" in
    --clients) clients="$2"; shift ;;
    --seconds) seconds="$2"; shift ;;
    --rounds) rounds="$2"; shift ;;
    --threads) threads="$2"; shift ;;
    --lines) lines="$2"; shift ;;
    --latency-lines) latency_lines="$2"; shift ;;
    --build) build="$2"; shift ;;
    --workers) workers="$2"; shift ;;
    --serve-threads) serve_threads="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "serve-vs-translate.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
  shift
done
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
# Both sides wait passively for OpenMP work unless told otherwise: on a shared machine spinning
# threads slow every process many times over (docs/benchmarks.md), and the load-test clients
# share the cores with the server.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
tmp="$(mktemp -d)"
server=""
cleanup() { [ -n "$server" ] && kill "$server" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
head -n "$lines" "$input" > "$tmp/sents"
head -n "$latency_lines" "$input" > "$tmp/lat"

"$build/luna-serve" "$ck" --port 0 --threads "${serve_threads:-$threads}" --workers "$workers" \
  > "$tmp/serve.out" 2> "$tmp/serve.err" &
server=$!
for _ in $(seq 600); do grep -q listening "$tmp/serve.out" 2>/dev/null && break; sleep 0.1; done
port="$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\)\/.*/\1/p' "$tmp/serve.out")"
[ -n "$port" ] || { cat "$tmp/serve.err" >&2; exit 1; }

# luna-translate's "translated N sentences (...) in X s" -> N / X
translate_rate() {
  "$build/luna-translate" "$ck" --input "$1" --threads "$threads" "${@:2}" 2>&1 >/dev/null |
    sed -n 's/.*translated \([0-9]*\) sentences ([0-9]* empty) in \([0-9.]*\) s.*/\1 \2/p'
}
serve_json() { python3 "$root/tools/bench/serve-load.py" --port "$port" --input "$1" --json "${@:2}" | tail -1; }
field() { python3 -c "import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

serve_json "$tmp/sents" --clients "$clients" --seconds 3 > /dev/null  # first touches of memory
tr_rates=() sv_rates=() p50=() p95=() p99=() errs=0 served=0 rss0=
for r in $(seq "$rounds"); do
  read -r n s < <(translate_rate "$tmp/sents")
  tr_rates+=("$(python3 -c "print(round($n / $s, 2))")")
  j="$(serve_json "$tmp/sents" --clients "$clients" --seconds "$seconds")"
  sv_rates+=("$(field "$j" sentences_per_s)")
  p50+=("$(field "$j" p50_ms)") p95+=("$(field "$j" p95_ms)") p99+=("$(field "$j" p99_ms)")
  errs=$((errs + $(field "$j" errors))) served=$((served + $(field "$j" requests)))
  [ -n "$rss0" ] || rss0="$(field "$j" rss_before_mb)"
  rss1="$(field "$j" rss_after_mb)"
  echo "round $r: luna-translate ${tr_rates[-1]} sentences/s, luna-serve ${sv_rates[-1]} sentences/s (mean batch $(field "$j" mean_batch_sentences))" >&2
done
tr="$(median "${tr_rates[@]}")" sv="$(median "${sv_rates[@]}")"

# Latency: each sentence alone, both ways, interleaved.
lat_tr=() lat_sv=() lat_dec=()
for r in $(seq "$rounds"); do
  read -r n s < <(translate_rate "$tmp/lat" --batch-size 1)
  lat_tr+=("$(python3 -c "print(round(1000 * $s / $n, 2))")")
  j="$(serve_json "$tmp/lat" --clients 1 --seconds 600 --max-requests "$latency_lines")"
  lat_sv+=("$(field "$j" mean_latency_ms)") lat_dec+=("$(field "$j" mean_server_decode_ms)")
done
ltr="$(median "${lat_tr[@]}")" lsv="$(median "${lat_sv[@]}")" ldec="$(median "${lat_dec[@]}")"

echo
echo "luna-serve vs luna-translate: $(basename "$ck"), $threads threads, $(nproc) cores, OMP_WAIT_POLICY=$OMP_WAIT_POLICY;"
echo "$lines sentences of $(basename "$input") ($latency_lines for latency); medians of $rounds interleaved rounds"
printf '%-44s %12s\n' "" "value"
printf '%-44s %12s\n' "luna-translate, whole file (sentences/s)" "$tr"
printf '%-44s %12s\n' "luna-serve, $clients clients (sentences/s)" "$sv"
printf '%-44s %12s\n' "  (luna-serve --workers, --threads)" "$workers, ${serve_threads:-$threads}"
printf '%-44s %11s%%\n' "luna-serve / luna-translate" "$(python3 -c "print(round(100 * $sv / $tr, 1))")"
printf '%-44s %12s\n' "luna-serve p50 / p95 / p99 (ms)" "$(median "${p50[@]}") / $(median "${p95[@]}") / $(median "${p99[@]}")"
printf '%-44s %12s\n' "luna-serve errors (all rounds)" "$errs"
printf '%-44s %12s\n' "luna-serve RSS over its $served requests (MB)" "$rss0 -> $rss1"
printf '%-44s %12s\n' "lone sentence: luna-translate alone (ms)" "$ltr"
printf '%-44s %12s\n' "lone sentence: luna-serve request (ms)" "$lsv"
printf '%-44s %12s\n' "  ratio to luna-translate alone" "$(python3 -c "print(round($lsv / $ltr, 3))")"
printf '%-44s %12s\n' "  its decode inside luna-serve (ms)" "$ldec"
printf '%-44s %12s\n' "  ratio to that decode" "$(python3 -c "print(round($lsv / $ldec, 3))")"
kill -TERM "$server"; wait "$server" || true; server=""
