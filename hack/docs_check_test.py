#!/usr/bin/python3
"""Tests of hack/docs_check.py with Debian's real headless chromium: the checker passes a sound site, fails
one with a broken link, a missing anchor or a missing image and names each, and opens a page again when
chromium dies of a signal (a stand-in that kills itself before it runs the real chromium), failing only when
it dies every time. Run by hack/docs-check.sh before it checks the built site:
    /usr/bin/python3 -m unittest hack/docs_check_test.py
"""

import os
import stat
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
CHECKER = os.path.join(HERE, "docs_check.py")
CHROMIUM = os.environ.get("DOCS_CHECK_CHROMIUM", "/usr/bin/chromium")

# Each page names its icon: without one chromium asks for /favicon.ico, as it would on the real site.
SOUND = {
    "index.html": '<html><head><link rel="icon" href="img/dot.svg"></head><body><a href="guide/">guide</a> <a href="guide/#install">install</a>'
                  ' <img src="img/dot.svg"></body></html>',
    "guide/index.html": '<html><head><link rel="icon" href="../img/dot.svg"></head><body><h2 id="install">Install</h2><a href="../index.html">home</a>'
                        ' <a href="https://example.org/">outside</a></body></html>',
    "img/dot.svg": '<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>',
}


def write_site(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)


def crashing_chromium(root, crashes):
    """A chromium that dies of SIGSEGV the first `crashes` times it is run for each page, then runs the
    real one: the crash comes from the process itself, as chromium's did."""
    path = os.path.join(root, "chromium")
    with open(path, "w") as f:
        f.write(f"""#!/bin/sh
for last; do :; done
mark="{root}/crashes-$(echo "$last" | tr -c 'a-zA-Z0-9' _)"
n=$(cat "$mark" 2>/dev/null || echo 0)
if [ "$n" -lt {crashes} ]; then echo $((n + 1)) > "$mark"; kill -SEGV $$; fi
exec {CHROMIUM} "$@"
""")
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


class DocsCheck(unittest.TestCase):
    def run_checker(self, files, chromium=CHROMIUM):
        with tempfile.TemporaryDirectory(prefix="docs-check-test-") as root:
            site = os.path.join(root, "site")
            write_site(site, files)
            if chromium is not CHROMIUM:
                chromium = chromium(root)
            r = subprocess.run([sys.executable, CHECKER, "--site", site, "--chromium", chromium],
                               capture_output=True, text=True, timeout=300)
            return r.returncode, r.stdout + r.stderr

    def test_a_sound_site_passes(self):
        code, out = self.run_checker(SOUND)
        self.assertEqual(code, 0, out)
        self.assertIn("2 pages opened in headless chromium, 7 links checked", out)
        self.assertIn("1 external links not followed", out)

    def test_broken_links_and_a_missing_image_fail_by_name(self):
        broken = dict(SOUND)
        broken["index.html"] = ('<html><head><link rel="icon" href="img/dot.svg"></head><body><a href="nowhere.html">x</a> <a href="guide/#upgrade">y</a>'
                                ' <img src="img/gone.png"></body></html>')
        code, out = self.run_checker(broken)
        self.assertEqual(code, 1, out)
        self.assertIn("'nowhere.html' leads to nowhere.html, which does not exist", out)
        self.assertIn("guide/index.html has no element with id 'upgrade'", out)
        self.assertIn("/img/gone.png got 404", out)

    def test_a_page_is_opened_again_when_chromium_dies_of_a_signal(self):
        code, out = self.run_checker(SOUND, lambda root: crashing_chromium(root, 1))
        self.assertEqual(code, 0, out)
        self.assertIn("chromium died of signal 11 on index.html; opening it again", out)
        self.assertIn("every page rendered", out)

    def test_a_page_that_crashes_chromium_every_time_fails(self):
        code, out = self.run_checker(SOUND, lambda root: crashing_chromium(root, 99))
        self.assertEqual(code, 1, out)
        self.assertIn("index.html: chromium could not render it (exit -11)", out)


if __name__ == "__main__":
    unittest.main()
