"""Shared by luna-serve's tests (tests/serve/test_*.py): a tiny checkpoint, a server on a random
port of 127.0.0.1, and HTTP helpers on the standard library only.

The checkpoint is luna_tiny after one update on a toy EN->DE corpus (luna-preprocess with a small
SentencePiece model, then luna-train): its translations are nonsense, but they are deterministic
and have a SentencePiece model and dictionaries like a real one, which is all that comparing the
server with luna-translate needs. About a second to make."""
import http.client
import json
import os
import random
import re
import select
import signal
import subprocess
import sys
import time

SKIP = 77  # CTest's SKIP_RETURN_CODE for these tests

WORDS = {"the": "der", "a": "ein", "man": "mann", "woman": "frau", "dog": "hund", "cat": "katze",
         "sits": "sitzt", "runs": "läuft", "on": "auf", "in": "im", "park": "park",
         "street": "straße", "red": "roter", "blue": "blauer", "child": "kind", "plays": "spielt"}


def skip(reason):
    print(f"skipped: {reason}")
    sys.exit(SKIP)


def make_checkpoint(tmp, preprocess, train):
    """checkpoint_last.safetensors of a one-update luna_tiny in tmp/ck."""
    rng = random.Random(1)
    words = sorted(WORDS)
    for split, n in (("train", 200), ("valid", 10)):
        with open(f"{tmp}/{split}.en", "w") as en, open(f"{tmp}/{split}.de", "w") as de:
            for _ in range(n):
                s = [rng.choice(words) for _ in range(rng.randint(3, 8))]
                en.write(" ".join(s) + "\n")
                de.write(" ".join(WORDS[w] for w in s) + "\n")
    run([preprocess, "--source-lang", "en", "--target-lang", "de", "--trainpref", f"{tmp}/train",
         "--validpref", f"{tmp}/valid", "--destdir", f"{tmp}/bin", "--joined-dictionary",
         "--bpe-vocab-size", "60"])
    run([train, f"{tmp}/bin", "--arch", "luna_tiny", "--max-tokens", "400", "--max-update", "1",
         "--save-dir", f"{tmp}/ck", "--threads", "1", "--no-progress-bar",
         "--no-epoch-checkpoints"])
    return f"{tmp}/ck/checkpoint_last.safetensors"


def run(cmd, stdin=None):
    p = subprocess.run(cmd, input=stdin, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p.stdout


class Server:
    """luna-serve on 127.0.0.1, a port of its choice (--port 0)."""

    def __init__(self, program, checkpoint, *args):
        self.proc = subprocess.Popen([program, checkpoint, "--port", "0", "--threads", "1", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self._read_line(60)
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"luna-serve did not start: {line!r}\n{self.proc.stderr.read()}")
        self.port = int(m.group(1))
        self.signalled = False

    def kill_with(self, sig=signal.SIGTERM):
        self.signalled = True
        self.proc.send_signal(sig)

    def _read_line(self, timeout):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        return self.proc.stdout.readline() if ready else ""

    def stop(self, sig=signal.SIGTERM, timeout=120):
        """Signal it (unless signalled before); its exit status and stderr."""
        if self.proc.poll() is None and not self.signalled:
            self.kill_with(sig)
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
            raise AssertionError(f"luna-serve did not stop within {timeout} s:\n{err}")
        return self.proc.returncode, err

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


def request(port, method, path, body=None, headers=None, timeout=120):
    """(status, headers dict, body bytes) of one request on a new connection."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        chunked = (headers or {}).get("Transfer-Encoding") == "chunked"
        c.request(method, path, body=body, headers=headers or {}, encode_chunked=chunked)
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def translate(port, sentences, **options):
    status, _, body = request(port, "POST", "/translate", {"sentences": sentences, **options})
    if status != 200:
        raise AssertionError(f"POST /translate: {status} {body!r}")
    return json.loads(body)


def metrics(port):
    """{'name{labels}': value} of GET /metrics."""
    status, _, body = request(port, "GET", "/metrics")
    assert status == 200, status
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def wait_for(what, cond, timeout=60, step=0.005):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"timed out waiting for {what}")


def programs_or_skip(argv, count):
    """The program paths from argv; skip when luna-serve was not built (no libmicrohttpd)."""
    if len(argv) < count + 1:
        print(f"usage: {argv[0]} " + " ".join(["PROGRAM"] * count), file=sys.stderr)
        sys.exit(2)
    progs = argv[1:count + 1]
    if not progs[0] or not os.path.exists(progs[0]):
        skip("luna-serve was not built (libmicrohttpd-dev missing: tools/ci/install-deps.sh)")
    return progs
