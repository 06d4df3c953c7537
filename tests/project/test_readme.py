"""The README stays short and points into the documentation site: its
relative links name files that exist (no Sphinx needed)."""
import os
import re

from conftest import ROOT

LINK = re.compile(r"\]\(([^)\s]+)\)")


def _readme():
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


def test_readme_is_short():
    assert len(_readme().splitlines()) <= 150


def test_readme_links_resolve():
    text = _readme()
    headings = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")
                for h in re.findall(r"^#+ (.*)$", text, re.M)}
    links = LINK.findall(text)
    assert any(link.startswith("docs/") for link in links)
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        path, _, anchor = link.partition("#")
        if not path:
            assert anchor in headings, link
        else:
            assert os.path.exists(os.path.join(ROOT, path)), link


def test_readme_links_every_page_of_the_site():
    pages = {os.path.relpath(os.path.join(folder, name), ROOT)
             for folder, _, names in os.walk(os.path.join(ROOT, "docs"))
             if "_build" not in folder and "generated" not in folder and "_" not in
             os.path.basename(folder)[:1]
             for name in names if name.endswith(".md")}
    linked = {link.partition("#")[0] for link in LINK.findall(_readme())}
    assert pages and pages <= linked, sorted(pages - linked)
