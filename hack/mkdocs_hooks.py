"""mkdocs hooks for nodeops' docs site (mkdocs.yml `hooks:`).

Debian 12 ships mkdocs 1.4, which lacks 1.5's `validation:` settings. These hooks log as warnings what
those settings would (`omitted_files`, `absolute_links`, `anchors: warn`), so `mkdocs build --strict`
fails on an orphan page, an absolute link or a link to a heading that does not exist. Links to missing
pages are mkdocs' own warnings already. The README, the landing page, must stay under 12 KB and link only to
files that exist. A nav entry holding a glob (`reference/cli/*.md`) is expanded to
the matching pages not listed elsewhere, so the generated CLI reference needs no hand-kept nav.
"""

import fnmatch
import logging
import os
import posixpath
import re
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit

# A child of mkdocs' logger, so --strict counts its warnings.
log = logging.getLogger("mkdocs.plugins.nodeops_docs")

_ids = {}  # page URL -> ids of its elements
_links = []  # (page URL, page source path, href)


def _listed(nav):
    out = set()
    for item in nav:
        if isinstance(item, str):
            out.add(item)
        elif isinstance(item, dict):
            for v in item.values():
                out |= _listed([v]) if isinstance(v, str) else _listed(v)
        elif isinstance(item, list):
            out |= _listed(item)
    return out


def _expand(nav, docs_dir, listed):
    out = []
    for item in nav:
        if isinstance(item, str) and "*" in item:
            found = []
            for root, _, names in os.walk(docs_dir):
                for n in names:
                    rel = os.path.relpath(os.path.join(root, n), docs_dir).replace(os.sep, "/")
                    if fnmatch.fnmatch(rel, item) and rel not in listed:
                        found.append(rel)
            out.extend(sorted(found))
        elif isinstance(item, dict):
            out.append({k: (_expand(v, docs_dir, listed) if isinstance(v, list) else v) for k, v in item.items()})
        else:
            out.append(item)
    return out


def on_config(config):
    nav = config.get("nav")
    if nav:
        config["nav"] = _expand(nav, config["docs_dir"], _listed(nav))
    _ids.clear()
    _links.clear()
    return config


def on_nav(nav, config, files):
    in_nav = {p.file.src_path for p in nav.pages}
    for f in files.documentation_pages():
        if f.src_path not in in_nav:
            log.warning("page %s is not in the nav of mkdocs.yml (no reader could find it)", f.src_path)
    return nav


class _Collect(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.hrefs = set(), []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("href") is not None:
            self.hrefs.append(a["href"])
        if tag == "img" and a.get("src") is not None:
            self.hrefs.append(a["src"])


def on_page_content(html, page, config, files):
    c = _Collect()
    c.feed(html)
    _ids[page.url] = c.ids
    for h in c.hrefs:
        _links.append((page.url, page.file.src_path, h))
    return html


README_LIMIT = 12 * 1024
_md_link = re.compile(r"\]\(([^)\s]+)\)")


def _check_readme(config):
    root = os.path.dirname(config["config_file_path"])
    path = os.path.join(root, "README.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    size = len(text.encode("utf-8"))
    if size > README_LIMIT:
        log.warning("README.md is %d bytes, over the landing page's %d: move detail to docs/", size, README_LIMIT)
    for href in _md_link.findall(text):
        parts = urlsplit(href)
        if parts.scheme or parts.netloc or not parts.path:
            continue
        if not os.path.exists(os.path.join(root, unquote(parts.path))):
            log.warning("README.md: link %r leads to a file that does not exist", href)


def on_post_build(config):
    _check_readme(config)
    for url, src, href in _links:
        parts = urlsplit(href)
        if parts.scheme or parts.netloc:
            continue
        if parts.path.startswith("/"):
            log.warning("%s: absolute link %r: link to the page relatively", src, href)
            continue
        target = url if not parts.path else posixpath.normpath(posixpath.join(posixpath.dirname(url), unquote(parts.path)))
        if parts.fragment and target in _ids and unquote(parts.fragment) not in _ids[target]:
            log.warning("%s: link %r names an anchor that %s does not have", src, href, target)
        if parts.path and not os.path.exists(os.path.join(config["site_dir"], target)):
            log.warning("%s: link %r leads nowhere in the built site", src, href)
