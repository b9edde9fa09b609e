#!/usr/bin/env python3
"""luna-serve's web page in a real browser (Debian's chromium, headless, through the DevTools
protocol): load the page, type a sentence into it, press Translate, and read the translation and
the time it took from the page; the translation must be luna-translate's.

    test_serve_browser.py LUNA_SERVE LUNA_TRANSLATE LUNA_PREPROCESS LUNA_TRAIN [--screenshot PNG]

Skips (exit 77) when luna-serve was not built or chromium is not installed
(tools/ci/install-deps.sh --browser). --screenshot also saves the page with its translation."""
import os
import re
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cdp  # noqa: E402
import serve_util as su  # noqa: E402


def main():
    serve, translate, preprocess, train = su.programs_or_skip(sys.argv, 4)
    screenshot = None
    if "--screenshot" in sys.argv:
        screenshot = os.path.abspath(sys.argv[sys.argv.index("--screenshot") + 1])
    chromium = cdp.find_chromium()
    if not chromium:
        su.skip("chromium is not installed (tools/ci/install-deps.sh --browser)")
    tmp = tempfile.mkdtemp(prefix="luna-serve-browser-")
    try:
        # Another checkpoint and text (lines separated by \n) for the screenshot in the docs.
        ck = os.environ.get("LUNA_SERVE_CHECKPOINT")
        maxlen = "200" if ck else "12"  # the one-update model never ends a translation itself
        ck = ck or su.make_checkpoint(tmp, preprocess, train)
        sentence = os.environ.get("LUNA_SERVE_SENTENCE", "the man sits in the park")
        expected = su.run([translate, ck, "--threads", "1", "--max-len-b", maxlen, "--quiet"],
                          stdin=sentence + "\n").rstrip("\n")
        with su.Server(serve, ck, "--max-len-b", maxlen) as server:
            start = time.monotonic()
            browser = cdp.Browser(chromium)
            try:
                url = f"http://127.0.0.1:{server.port}/"
                browser.open_page(url)
                print(f"loaded {url}: title {browser.evaluate('document.title')!r}")
                browser.wait_for("the model name", "document.getElementById('model')"
                                 ".textContent.includes('checkpoint')")
                browser.type_text("#source", sentence)
                typed = browser.evaluate("document.getElementById('source').value")
                print(f"typed {typed!r}")
                browser.click("#translate")
                browser.wait_for("the translation", "document.body.dataset.done === '1'")
                output = browser.evaluate("document.getElementById('output').textContent")
                took = browser.evaluate("document.getElementById('time').textContent")
                error = browser.evaluate("document.getElementById('error').textContent")
                print(f"page shows translation {output!r}")
                print(f"page shows time {took!r}")
                if screenshot:
                    browser.screenshot(screenshot)
                    print(f"screenshot: {screenshot}")
            finally:
                browser.close()
            rc, err = server.stop()
        print(f"luna-translate gives    {expected!r}")
        ok = (typed == sentence and output == expected and not error and rc == 0 and
              re.fullmatch(r"\d+ sentences? in \d+ ms \(server: decode \d+ ms, queue \d+ ms\)",
                           took))
        print(f"browser test {'passed' if ok else 'FAILED'} in {time.monotonic() - start:.1f} s")
        if not ok:
            print(f"error line {error!r}; server exit {rc}: {err}")
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
