#!/usr/bin/env python3
"""Load test for luna-serve: N concurrent clients, each on its own keep-alive connection, send
single sentences (POST /translate) one after another for T seconds or until R requests in all,
then print throughput, latency percentiles, errors and the server's resident memory before and
after (its /metrics process_resident_memory_bytes).

    tools/bench/serve-load.py --port 8080 --input ../shared/data/multi30k/test_2016_flickr.en \\
        --clients 32 --seconds 30 --max-requests 10000

Bounded on purpose: at most --seconds and --max-requests, and only to this machine (127.0.0.1,
localhost or ::1). The sentences are taken in order (client i starts at line i and steps by N),
so a run with R < lines sends each sentence at most once. --json prints the numbers as one JSON
object on the last line (tools/bench/serve-vs-translate.sh reads it)."""
import argparse
import http.client
import json
import sys
import threading
import time

LOCAL = ("127.0.0.1", "localhost", "::1")


def metrics(host, port):
    c = http.client.HTTPConnection(host, port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def percentile(sorted_values, p):
    if not sorted_values:
        return float("nan")
    k = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[k]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--host", default="127.0.0.1", help="the server (this machine only)")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--input", required=True, help="sentences, one per line")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=30, help="at most this long (max 600)")
    ap.add_argument("--max-requests", type=int, default=10000, help="at most this many in all")
    ap.add_argument("--beam", type=int, default=None, help="beam_size of each request")
    ap.add_argument("--max-length", type=int, default=None, help="max_length of each request")
    ap.add_argument("--json", action="store_true", help="also print the results as JSON")
    a = ap.parse_args()
    if a.host not in LOCAL:
        ap.error(f"--host {a.host}: only this machine ({', '.join(LOCAL)}) may be load-tested")
    if not (1 <= a.clients <= 1024 and 0 < a.seconds <= 600 and 1 <= a.max_requests <= 10**6):
        ap.error("--clients 1..1024, --seconds 0..600, --max-requests 1..1000000")
    with open(a.input, encoding="utf-8") as f:
        sentences = [line.rstrip("\n") for line in f if line.strip()]
    if not sentences:
        ap.error(f"{a.input}: no sentences")
    options = {}
    if a.beam:
        options["beam_size"] = a.beam
    if a.max_length:
        options["max_length"] = a.max_length

    before = metrics(a.host, a.port)
    lock = threading.Lock()
    issued = [0]
    latencies, decode, errors = [], [], {}
    deadline = time.monotonic() + a.seconds

    def client(i):
        conn = http.client.HTTPConnection(a.host, a.port, timeout=max(60, a.seconds))
        k = i
        while time.monotonic() < deadline:
            with lock:
                if issued[0] >= a.max_requests:
                    break
                issued[0] += 1
            body = json.dumps({"sentences": [sentences[k % len(sentences)]], **options})
            k += a.clients
            t0 = time.monotonic()
            try:
                conn.request("POST", "/translate", body=body,
                             headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                answer = r.read()
                status = r.status
            except (OSError, http.client.HTTPException) as e:
                status = type(e).__name__
                conn.close()
                conn = http.client.HTTPConnection(a.host, a.port, timeout=max(60, a.seconds))
            dt = time.monotonic() - t0
            with lock:
                if status == 200:
                    latencies.append(dt)
                    decode.append(json.loads(answer)["decode_ms"] / 1000)
                else:
                    errors[status] = errors.get(status, 0) + 1
        conn.close()

    start = time.monotonic()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - start
    after = metrics(a.host, a.port)

    lat = sorted(latencies)
    n_err = sum(errors.values())
    rss0 = before.get("process_resident_memory_bytes", 0)
    rss1 = after.get("process_resident_memory_bytes", 0)
    batches = after["luna_serve_batch_sentences_count"] - before["luna_serve_batch_sentences_count"]
    tokens = after["luna_serve_target_tokens_total"] - before["luna_serve_target_tokens_total"]
    res = {
        "clients": a.clients, "requests": len(lat) + n_err, "ok": len(lat), "errors": n_err,
        "errors_by_status": {str(k): v for k, v in errors.items()}, "seconds": round(wall, 3),
        "sentences_per_s": round(len(lat) / wall, 2), "target_tokens_per_s": round(tokens / wall, 1),
        "p50_ms": round(1000 * percentile(lat, 50), 1), "p95_ms": round(1000 * percentile(lat, 95), 1),
        "p99_ms": round(1000 * percentile(lat, 99), 1),
        "mean_batch_sentences": round(len(lat) / batches, 2) if batches else 0,
        "mean_latency_ms": round(1000 * sum(lat) / len(lat), 2) if lat else None,
        "mean_server_decode_ms": round(1000 * sum(decode) / len(decode), 2) if decode else None,
        "rss_before_mb": round(rss0 / 2**20, 1), "rss_after_mb": round(rss1 / 2**20, 1),
        "rss_growth_pct": round(100 * (rss1 - rss0) / rss0, 2) if rss0 else None,
    }
    print(f"luna-serve load test: {a.clients} clients, {res['requests']} requests in "
          f"{res['seconds']} s")
    print(f"  throughput   {res['sentences_per_s']} sentences/s, {res['target_tokens_per_s']} "
          f"target tokens/s (mean batch {res['mean_batch_sentences']} sentences)")
    print(f"  latency      p50 {res['p50_ms']} ms, p95 {res['p95_ms']} ms, p99 {res['p99_ms']} ms; "
          f"mean {res['mean_latency_ms']} ms, of which the batch's decode {res['mean_server_decode_ms']} ms")
    print(f"  errors       {n_err} {res['errors_by_status'] if n_err else ''}".rstrip())
    print(f"  server RSS   {res['rss_before_mb']} MB before, {res['rss_after_mb']} MB after "
          f"({res['rss_growth_pct']:+.2f}%)" if rss0 else "  server RSS   unknown")
    if a.json:
        print(json.dumps(res))
    return 1 if n_err else 0


if __name__ == "__main__":
    sys.exit(main())
