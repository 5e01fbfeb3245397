#!/usr/bin/python3
"""Opens every page of the built docs site (bin/site) in Debian's headless chromium and fails on a broken link
or a missing image. Run through hack/docs-check.sh, which installs chromium and builds the site first.

The site is served on loopback by this process, which records every request chromium makes: a page whose
rendering asks for anything that is not there (an image, a stylesheet, a script) fails with that path.
Each rendered page's links are then resolved: a link to a page or file that does not exist, or to an
anchor the target page does not have, fails too. External links are listed, not followed (no network).
"""

import argparse
import http.server
import os
import subprocess
import sys
import tempfile
import threading
from html.parser import HTMLParser
from urllib.parse import unquote, urljoin, urlsplit

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    # /dev/shm is small in containers; chromium crashes on big pages without this.
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
]

# Pages and shots for --screenshots: the home page and one how-to.
SCREENSHOTS = {"index.html": "home.png", "how-to/upgrade.html": "howto-upgrade.png"}


class Log:
    def __init__(self):
        self.lock = threading.Lock()
        self.entries = []

    def add(self, path, code):
        with self.lock:
            self.entries.append((path, code))

    def take(self):
        with self.lock:
            out, self.entries = self.entries, []
        return out


def serve(site, log):
    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=site, **kw)

        def log_request(self, code="-", size="-"):
            log.add(self.path, int(code) if str(code).isdigit() else 0)

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


class DOM(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.links = set(), []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if a.get("name") and tag == "a":
            self.ids.add(a["name"])
        for attr in ("href", "src"):
            v = a.get(attr)
            if v is not None and tag in ("a", "img", "link", "script", "source", "iframe"):
                self.links.append((tag, v))


# How many times a page is opened again when chromium dies of a signal. Such a crash says nothing of the
# page (on 2026-12-05 chromium died of SIGSEGV on one page of 70 on a loaded 2-core machine; the same page
# rendered in the next check); a page that crashes chromium every time still fails.
CRASH_RETRIES = 2


def chromium(binary, profile, args, page, log=None, timeout=60):
    cmd = [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
    for attempt in range(CRASH_RETRIES + 1):
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if r.returncode >= 0 or attempt == CRASH_RETRIES:
            return r
        print(f"docs-check: chromium died of signal {-r.returncode} on {page}; opening it again", file=sys.stderr)
        if log is not None:
            log.take()  # the requests of the crashed run


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--site", default="bin/site")
    ap.add_argument("--chromium", default="chromium")
    ap.add_argument("--screenshots", metavar="DIR", help="write the home page's and one how-to's screenshots here")
    opts = ap.parse_args()

    site = os.path.abspath(opts.site)
    pages = sorted(
        os.path.relpath(os.path.join(root, n), site).replace(os.sep, "/")
        for root, _, names in os.walk(site)
        for n in names
        if n.endswith(".html") and n != "404.html"
    )
    if not pages:
        sys.exit(f"docs-check: no pages under {site}: run make docs first")

    log = Log()
    httpd = serve(site, log)
    base = f"http://127.0.0.1:{httpd.server_address[1]}/"
    problems, doms, external = [], {}, set()

    with tempfile.TemporaryDirectory(prefix="docs-check-chromium-") as profile:
        for page in pages:
            log.take()
            r = chromium(opts.chromium, profile, ["--virtual-time-budget=5000", "--dump-dom", base + page], page, log)
            if r.returncode != 0 or "<html" not in r.stdout:
                problems.append(f"{page}: chromium could not render it (exit {r.returncode}): {r.stderr.strip()[-300:]}")
                continue
            for path, code in log.take():
                if code >= 400:
                    problems.append(f"{page}: the browser's request for {path} got {code} (missing image, style or script)")
            d = DOM()
            d.feed(r.stdout)
            doms[page] = d

        for page, d in doms.items():
            for tag, link in d.links:
                url = urljoin(base + page, link)
                parts = urlsplit(url)
                if parts.scheme in ("mailto", "javascript", "data", "blob"):
                    continue
                if not url.startswith(base):
                    external.add(link)
                    continue
                target = unquote(parts.path[len(urlsplit(base).path):]) or "index.html"
                if target.endswith("/"):
                    target += "index.html"
                if not os.path.exists(os.path.join(site, target)):
                    problems.append(f"{page}: <{tag}> {link!r} leads to {target}, which does not exist")
                elif parts.fragment and target in doms and unquote(parts.fragment) not in doms[target].ids:
                    problems.append(f"{page}: <{tag}> {link!r}: {target} has no element with id {parts.fragment!r}")

        if opts.screenshots and not problems:
            os.makedirs(opts.screenshots, exist_ok=True)
            for page, name in SCREENSHOTS.items():
                out = os.path.abspath(os.path.join(opts.screenshots, name))
                r = chromium(opts.chromium, profile, ["--window-size=1280,900", f"--screenshot={out}", base + page], page)
                if r.returncode != 0 or not os.path.exists(out):
                    problems.append(f"screenshot of {page} failed: {r.stderr.strip()[-300:]}")
                else:
                    print(f"docs-check: screenshot of {page} in {out}")

    httpd.shutdown()
    print(f"docs-check: {len(pages)} pages opened in headless chromium, {sum(len(d.links) for d in doms.values())} links checked, "
          f"{len(external)} external links not followed")
    if problems:
        print("docs-check: FAILED", file=sys.stderr)
        for p in problems:
            print("  " + p, file=sys.stderr)
        sys.exit(1)
    print("docs-check: every page rendered with no broken link or missing image")


if __name__ == "__main__":
    main()
