#!/usr/bin/env python3
"""luna-serve over HTTP on 127.0.0.1 (random ports), against luna-translate on the same checkpoint:

  the translations and scores of POST /translate equal luna-translate's (n-best too), alone and
  from concurrent clients batched together; every error answer (400, 404, 405, 413 by
  Content-Length, by a chunked body, by sentence count and by sentence length, 503 with
  Retry-After when the queue is full, 504 at the deadline) with its JSON message and its counter
  in /metrics; /health, /metrics and the page; a client sending its body slowly does not hold up
  another; SIGTERM while busy answers every request already received and exits 0; with
  --workers 2 a request is translated while the other worker is busy.

    test_serve.py LUNA_SERVE LUNA_TRANSLATE LUNA_PREPROCESS LUNA_TRAIN

Skips (exit 77) when luna-serve was not built (no libmicrohttpd)."""
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_util as su  # noqa: E402

SERVE, TRANSLATE, PREPROCESS, TRAIN = su.programs_or_skip(sys.argv, 4)
TMP = tempfile.mkdtemp(prefix="luna-serve-test-")
CK = None
SENTENCES = ["the man sits in the park", "a red dog runs", "", "the child plays on the street",
             "a blue cat", "woman"]
MAXLEN = "12"  # short translations keep the tests fast; the one-update model never stops early


def reference(sentences, *args):
    """luna-translate's fairseq lines for the sentences: {(kind, i): [fields]}."""
    out = su.run([TRANSLATE, CK, "--threads", "1", "--max-len-b", MAXLEN, "--quiet",
                  "--output-format", "fairseq", *args], stdin="\n".join(sentences) + "\n")
    lines = {}
    for line in out.splitlines():
        tag, _, rest = line.partition("\t")
        kind, i = tag.split("-")
        lines.setdefault((kind, int(i)), []).append(rest.split("\t"))
    return lines


def long_job(port, sentences=4, beam=8):
    """A request that keeps the worker busy (the longest translations) in a thread; its result."""
    box = {}

    def go():
        start = time.monotonic()
        box["r"] = su.request(port, "POST", "/translate",
                              {"sentences": SENTENCES[:1] * sentences, "max_length": 1022,
                               "beam_size": beam})
        box["seconds"] = time.monotonic() - start
    t = threading.Thread(target=go)
    t.start()
    su.wait_for("the long job to start",
                lambda: su.metrics(port)["luna_serve_running_requests"] == 1)
    return t, box


def setUpModule():
    global CK
    CK = su.make_checkpoint(TMP, PREPROCESS, TRAIN)


def tearDownModule():
    shutil.rmtree(TMP, ignore_errors=True)


class Answers(unittest.TestCase):
    """One server with small limits for the translations and the answers that need no load."""

    @classmethod
    def setUpClass(cls):
        cls.server = su.Server(SERVE, CK, "--max-sentences", "8", "--max-sentence-bytes", "300",
                               "--max-body-bytes", "8192", "--max-queue", "64", "--max-len-b",
                               MAXLEN)
        cls.port = cls.server.port

    @classmethod
    def tearDownClass(cls):
        rc, err = cls.server.stop()
        assert rc == 0, err

    def test_same_as_luna_translate(self):
        ref = reference(SENTENCES)
        got = su.translate(self.port, SENTENCES)["translations"]
        self.assertEqual(len(got), len(SENTENCES))
        for i, t in enumerate(got):
            score, text = ref[("D", i)][0]
            self.assertEqual(t["text"], text, f"sentence {i}")
            if SENTENCES[i]:
                self.assertAlmostEqual(t["score"], float(score), places=3, msg=f"sentence {i}")
        print(f"same as luna-translate: {len(got)} sentences, e.g. {got[0]}")

    def test_nbest_same_as_luna_translate(self):
        ref = reference(SENTENCES[:2], "--nbest", "3")
        got = su.translate(self.port, SENTENCES[:2], num_hypotheses=3)["translations"]
        for i, t in enumerate(got):
            self.assertEqual([(h["text"], round(h["score"], 3)) for h in t["hypotheses"]],
                             [(text, round(float(s), 3)) for s, text in ref[("D", i)]])

    def test_concurrent_clients_same_as_luna_translate(self):
        ref = reference(SENTENCES)
        results = [None] * len(SENTENCES)

        def one(i):
            results[i] = su.translate(self.port, [SENTENCES[i]])["translations"][0]["text"]
        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(SENTENCES))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(results, [ref[("D", i)][0][1] for i in range(len(SENTENCES))])

    def expect_error(self, status, kind, method, path, body=None, headers=None, says=""):
        before = su.metrics(self.port)
        got, hdrs, raw = su.request(self.port, method, path, body, headers)
        self.assertEqual(got, status, raw)
        err = json.loads(raw)["error"]
        self.assertEqual(err["kind"], kind)
        self.assertIn(says, err["message"])
        self.assertNotIn("\n", err["message"])
        after = su.metrics(self.port)
        key = f'luna_serve_errors_total{{kind="{kind}"}}'
        self.assertEqual(after[key] - before[key], 1, key)
        print(f"{method} {path} -> {got}: {err['message']}")
        return hdrs

    def test_bad_requests_are_400_with_a_message(self):
        post = ("POST", "/translate")
        self.expect_error(400, "bad_request", *post, b'{"sentences": ["a",', says="JSON: byte")
        self.expect_error(400, "bad_request", *post, b'["a"]', says="must be a JSON object")
        self.expect_error(400, "bad_request", *post, b"{}", says='"sentences" is missing')
        self.expect_error(400, "bad_request", *post, {"sentences": ["a"], "beam": 2},
                          says='unknown member "beam"')
        self.expect_error(400, "bad_request", *post, {"sentences": ["a"], "beam_size": "4"},
                          says='"beam_size" must be an integer')
        self.expect_error(400, "bad_request", *post, {"sentences": ["a"], "beam_size": 2,
                                                      "num_hypotheses": 3}, says="num_hypotheses")
        self.expect_error(400, "bad_request", *post, {"sentences": ["a\nb"]},
                          says="sentence 0: control character 0x0a")
        self.expect_error(400, "bad_request", *post, {"sentences": [1]},
                          says="sentence 0: must be a string")
        self.expect_error(400, "bad_request", *post, b'{"sentences": ["\xff"]}',
                          says="invalid UTF-8")

    def test_too_large_is_413(self):
        post = ("POST", "/translate")
        self.expect_error(413, "too_large", *post, b" " * 9000, says="limit of 8192 bytes")
        self.expect_error(413, "too_large", *post, iter([b" " * 5000, b" " * 5000]),
                          headers={"Transfer-Encoding": "chunked"}, says="limit of 8192 bytes")
        self.expect_error(413, "too_large", *post, {"sentences": ["a"] * 9},
                          says="9 sentences, more than this server's limit of 8")
        self.expect_error(413, "too_large", *post, {"sentences": ["a", "b" * 301]},
                          says="sentence 1: 301 bytes")

    def test_unknown_paths_and_methods(self):
        self.expect_error(404, "not_found", "GET", "/nope")
        hdrs = self.expect_error(405, "method", "GET", "/translate")
        self.assertEqual(hdrs.get("Allow"), "POST")
        self.expect_error(405, "method", "POST", "/health", b"{}")

    def test_health_metrics_and_page(self):
        status, _, body = su.request(self.port, "GET", "/health")
        self.assertEqual(status, 200)
        h = json.loads(body)
        self.assertEqual((h["status"], h["model"]), ("ok", "checkpoint_last.safetensors"))
        su.translate(self.port, SENTENCES[:2])
        m = su.metrics(self.port)
        for key in ('luna_serve_requests_total{endpoint="/translate",code="200"}',
                    "luna_serve_request_seconds_count", 'luna_serve_request_seconds_bucket{le="+Inf"}',
                    "luna_serve_batch_sentences_count", "luna_serve_target_tokens_total",
                    "luna_serve_tokens_per_second", "luna_serve_queue_sentences",
                    "process_resident_memory_bytes"):
            self.assertIn(key, m)
        self.assertGreaterEqual(m["luna_serve_sentences_total"], 2)
        status, hdrs, body = su.request(self.port, "GET", "/")
        self.assertEqual(status, 200)
        self.assertTrue(hdrs["Content-Type"].startswith("text/html"))
        self.assertIn(b'<textarea id="source"', body)


class UnderLoad(unittest.TestCase):
    """A server per test, its worker kept busy by a long request."""

    def setUp(self):
        self.server = su.Server(SERVE, CK, "--max-queue", "6", "--max-sentences", "6",
                                "--max-len-b", MAXLEN, "--connection-timeout", "60")
        self.port = self.server.port

    def tearDown(self):
        if self.server.proc.poll() is None:
            rc, err = self.server.stop()
            self.assertEqual(rc, 0, err)  # under ASan, also: nothing leaked

    def test_queue_full_is_503_with_retry_after(self):
        t, box = long_job(self.port)
        queued = threading.Thread(target=su.translate, args=(self.port, SENTENCES[:5]))
        queued.start()
        su.wait_for("5 sentences queued",
                    lambda: su.metrics(self.port)["luna_serve_queue_sentences"] == 5)
        status, hdrs, body = su.request(self.port, "POST", "/translate",
                                        {"sentences": SENTENCES[:2]})
        self.assertEqual((status, hdrs.get("Retry-After")), (503, "1"), body)
        self.assertEqual(json.loads(body)["error"]["kind"], "queue_full")
        print(f"queue full -> 503, Retry-After 1: {json.loads(body)['error']['message']}")
        self.assertEqual(su.metrics(self.port)['luna_serve_errors_total{kind="queue_full"}'], 1)
        queued.join()
        t.join()
        self.assertEqual(box["r"][0], 200)

    def test_deadline_is_504(self):
        t, box = long_job(self.port)
        start = time.monotonic()
        status, _, body = su.request(self.port, "POST", "/translate",
                                     {"sentences": SENTENCES[:1], "timeout_ms": 50})
        waited = time.monotonic() - start
        self.assertEqual(status, 504, body)
        self.assertEqual(json.loads(body)["error"]["kind"], "deadline")
        self.assertLess(waited, 10)
        print(f"deadline -> 504 after {waited:.2f} s: {json.loads(body)['error']['message']}")
        t.join()
        print(f"(the request ahead of it took {box['seconds']:.2f} s)")
        self.assertEqual(su.metrics(self.port)["luna_serve_queue_requests"], 0)

    def test_queued_requests_are_batched_together(self):
        ref = reference(SENTENCES[:5])
        t, _ = long_job(self.port, sentences=1)
        results = [None] * 5

        def one(i):
            results[i] = su.translate(self.port, [SENTENCES[i]])["translations"][0]["text"]
        clients = [threading.Thread(target=one, args=(i,)) for i in range(5)]
        for c in clients:
            c.start()
        su.wait_for("5 requests queued",
                    lambda: su.metrics(self.port)["luna_serve_queue_requests"] == 5)
        for c in clients + [t]:
            c.join()
        self.assertEqual(results, [ref[("D", i)][0][1] for i in range(5)])
        m = su.metrics(self.port)
        # the long job alone, then the five queued behind it in one engine call
        self.assertEqual(m["luna_serve_batch_requests_count"], 2)
        self.assertEqual(m['luna_serve_batch_requests_bucket{le="4"}'], 1)

    def test_slow_body_does_not_block_others(self):
        body = json.dumps({"sentences": SENTENCES[:1]}).encode()
        slow = socket.create_connection(("127.0.0.1", self.port))
        slow.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])
        start = time.monotonic()
        other = su.translate(self.port, SENTENCES[1:2])
        elapsed = time.monotonic() - start
        self.assertEqual(other["translations"][0]["text"], reference(SENTENCES[1:2])[("D", 0)][0][1])
        slow.sendall(body[10:])
        status, reply = read_response(slow)
        slow.close()
        self.assertEqual(status, 200, reply)
        self.assertEqual(json.loads(reply)["translations"][0]["text"],
                         reference(SENTENCES[:1])[("D", 0)][0][1])
        print(f"another client's request took {elapsed:.2f} s while a body was stalled")

    def test_sigterm_while_busy_answers_every_received_request(self):
        ref = reference(SENTENCES[:5])
        t, box = long_job(self.port, sentences=1)
        results = [None] * 5

        def one(i):
            results[i] = su.request(self.port, "POST", "/translate", {"sentences": [SENTENCES[i]]})
        clients = [threading.Thread(target=one, args=(i,)) for i in range(5)]
        for c in clients:
            c.start()
        su.wait_for("5 requests queued",
                    lambda: su.metrics(self.port)["luna_serve_queue_requests"] == 5)
        # and one whose body is still arriving
        body = json.dumps({"sentences": SENTENCES[5:6]}).encode()
        slow = socket.create_connection(("127.0.0.1", self.port))
        slow.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
                     % len(body) + body[:5])
        # (the gauge drops a request when its answer is queued, so earlier polls are not in it)
        su.wait_for("7 requests in flight",  # the metrics request itself is the 8th
                    lambda: su.metrics(self.port)["luna_serve_in_flight_requests"] == 8)
        self.server.kill_with(signal.SIGTERM)
        # no new connections once stopping
        su.wait_for("the listening socket to close", lambda: refused(self.port))
        slow.sendall(body[5:])
        slow_status, slow_body = read_response(slow)
        slow.close()
        for c in clients + [t]:
            c.join()
        rc, err = self.server.stop()
        self.assertEqual(rc, 0, err)
        self.assertEqual(box["r"][0], 200)
        self.assertEqual([(s, json.loads(b)["translations"][0]["text"]) for s, _, b in results],
                         [(200, ref[("D", i)][0][1]) for i in range(5)])
        self.assertEqual(slow_status, 200, slow_body)
        self.assertEqual((slow_status, json.loads(slow_body)["translations"][0]["text"]),
                         (200, reference(SENTENCES[5:6])[("D", 0)][0][1]))
        print(f"SIGTERM with 7 requests in flight (one body still arriving): all answered, "
              f"exit 0; {err.strip()!r}")


class Workers(unittest.TestCase):
    """--workers 2: two translators, batches side by side."""

    def test_second_worker_translates_while_the_first_is_busy(self):
        with su.Server(SERVE, CK, "--workers", "2", "--max-len-b", MAXLEN) as server:
            ref = reference(SENTENCES)
            t, box = long_job(server.port)
            got = su.translate(server.port, SENTENCES)["translations"]
            self.assertEqual([g["text"] for g in got],
                             [ref[("D", i)][0][1] for i in range(len(SENTENCES))])
            # answered while the other worker is still on the long job (its client has no
            # answer yet; the running-requests gauge may still count the request just answered)
            self.assertNotIn("r", box)
            self.assertGreaterEqual(su.metrics(server.port)["luna_serve_running_requests"], 1)
            t.join()
            self.assertEqual(box["r"][0], 200)
            rc, err = server.stop()
            self.assertEqual(rc, 0, err)


def read_response(sock):
    """(status, body) of one HTTP/1.1 answer with a Content-Length read from a raw socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise AssertionError(f"connection closed: {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    length = next(int(v) for k, _, v in (h.partition(": ") for h in lines[1:])
                  if k.lower() == "content-length")
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(lines[0].split()[1]), body


def refused(port):
    """Whether a connection to port is refused. A reset is not yet an answer: a listening socket
    closing with connections in its accept queue resets them, and the next attempt is refused."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except ConnectionRefusedError:
        return True
    except ConnectionResetError:
        return False


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
