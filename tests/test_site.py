"""Browser test of the trace site: ``mkdocs build --strict`` of traces/, served on 127.0.0.1, every page opened in
headless Chromium (Debian's ``chromium`` driven by Playwright). Every Mermaid block must render to an SVG that
shows its labels, no page may log a console error, and no request may leave localhost (all are routed; non-local
ones are recorded and aborted). Missing tooling fails the test with the install step, it never skips.

``SENTINEL_SCREENSHOTS=DIR`` saves a full-page screenshot of every page there; ``SENTINEL_CHROMIUM`` overrides
the browser path.
"""
from __future__ import annotations

import functools
import html
import html.parser
import http.server
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = os.environ.get("SENTINEL_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run"]
# material renders each diagram into a *closed* shadow root; open them so the test can read the SVG.
OPEN_SHADOW_ROOTS = """
const attachShadow = Element.prototype.attachShadow;
Element.prototype.attachShadow = function (init) { return attachShadow.call(this, { ...init, mode: "open" }); };
"""
RENDERED_SVG_TEXT = """() => [...document.querySelectorAll("div.mermaid")]
    .map(d => d.shadowRoot && d.shadowRoot.querySelector("svg"))
    .map(svg => svg ? svg.textContent : null)"""
MERMAID_BLOCK = re.compile(r'<pre class="mermaid"><code>(.*?)</code></pre>', re.S)
LOCAL_HOSTS = ("127.0.0.1", "localhost")
DESKTOP = {"width": 1400, "height": 900}
# Markup that did not render: an admonition left as text, a Sphinx role of a docstring
RAW_MARKUP = re.compile(r"!!! ?[a-z]+|:(?:[a-z]+:)?(?:class|func|meth|mod|attr|data|exc|obj|ref|doc):")
COMMIT_LINE = re.compile(r"\bcommit:?\s+(\S+)", re.I)
COMMIT_ID = re.compile(r"[0-9a-f]{4,40}")
# a page's prose: the text of its article without code, preformatted blocks or scripts
PROSE = """() => { const a = document.querySelector("article").cloneNode(true);
    a.querySelectorAll("pre, code, script, style, .mermaid").forEach(e => e.remove()); return a.textContent; }"""
# elements wider than their box at this width: the page itself, a table or its wrappers (they vary by theme version),
# a code block
SIDEWAYS = """() => [document.scrollingElement, ...document.querySelectorAll(
        ".md-typeset__scrollwrap, .md-typeset__table, .md-typeset table, .md-typeset pre > code")]
    .filter(e => e.scrollWidth > e.clientWidth + 1)
    .map(e => `${e.tagName.toLowerCase()}.${e.className}: ${e.scrollWidth} px in ${e.clientWidth} px`)"""
# the commit of every header line of the benchmark pages and of every record line of the trace pages
COMMITS = """() => [...document.querySelectorAll("article li, article p")]
    .filter(e => /^(Commit:|Record )/.test(e.textContent.trim())).map(e => e.textContent.trim())"""


class ArticleText(html.parser.HTMLParser):
    """The text of an HTML page's article outside the ``skipped`` elements (for the checks that need no browser)."""

    def __init__(self, skipped: tuple[str, ...]) -> None:
        super().__init__()
        self.skipped, self.depth, self.inside, self.parts = skipped, 0, False, []

    def handle_starttag(self, tag: str, attrs) -> None:
        self.inside = self.inside or tag == "article"
        self.depth += tag in self.skipped

    def handle_endtag(self, tag: str) -> None:
        self.depth -= tag in self.skipped
        self.inside = self.inside and tag != "article"

    def handle_data(self, data: str) -> None:
        if self.inside and not self.depth:
            self.parts.append(data)


def article_text(page_html: str, skipped: tuple[str, ...] = ("pre", "code", "script", "style")) -> str:
    """The article's text; by default its prose (``PROSE`` without a browser)."""
    parser = ArticleText(skipped)
    parser.feed(page_html)
    return "".join(parser.parts)


def unrendered(text: str) -> list[str]:
    """Raw markup in a page's prose: admonitions and Sphinx roles."""
    return RAW_MARKUP.findall(text)


def commits_not_ids(lines: list[str]) -> list[str]:
    """The lines of ``COMMITS`` whose commit is no commit id."""
    return [line for line in lines if not any(COMMIT_ID.fullmatch(c.strip("`.,;:()")) for c in
                                              COMMIT_LINE.findall(line))]


def require(ok: object, message: str) -> None:
    if not ok:
        pytest.fail(message, pytrace=False)


# mkdocs build --strict of mkdocs.yml with another docs_dir and site_dir (the command line cannot move docs_dir)
BUILD = ("import sys; from mkdocs.commands.build import build; from mkdocs.config import load_config; "
         "build(load_config(sys.argv[1], docs_dir=sys.argv[2], site_dir=sys.argv[3], strict=True))")


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of traces/ whose trace documents (``sentinel trace``) and benchmark pages (``python -m benchmarks
    site``) are generated now, from the code and the committed records and results: the site of this code.
    ``sentinel trace --check`` and tests/test_benchmarks_site.py tell whether the committed ones are these."""
    from benchmarks import site as benchmark_site
    from benchmarks.common import RESULTS
    from kernel_sentinel import registry, trace

    out = tmp_path_factory.mktemp("docs") / "traces"
    shutil.copytree(REPO / "traces", out)
    trace.write(trace.generate(registry.families(), out), out)
    benchmark_site.write_pages(RESULTS, pages=out / "guide" / "benchmarks")
    return out


@pytest.fixture(scope="module")
def site(docs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built from ``docs`` with mkdocs.yml (``mkdocs build --strict``) into a temporary directory."""
    for module in ("mkdocs", "material", "playwright"):
        require(importlib.util.find_spec(module), f"{module} is not installed: pip install -e '.[docs]'")
    require(shutil.which("npm"), "npm is not installed (the docs build fetches Mermaid with it): apt-get install npm")
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-c", BUILD, str(REPO / "mkdocs.yml"), str(docs), str(out)], cwd=REPO,
                          capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    require(done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}")
    return out


@pytest.fixture(scope="module")
def base_url(site: Path):
    """``site`` served over HTTP on 127.0.0.1 from a background thread."""

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    thread.join()


@pytest.fixture(scope="module")
def browser():
    require(Path(CHROMIUM).is_file(), f"Chromium not found at {CHROMIUM}: apt-get install chromium")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True)
        yield browser
        browser.close()


def page_paths(site: Path) -> list[str]:
    """URL paths of the built pages (directory URLs; the 404 page is not one)."""
    return sorted("" if p.parent == site else p.parent.relative_to(site).as_posix() + "/"
                  for p in site.rglob("index.html"))


def url_of(document: Path) -> str:
    """Directory URL of a Markdown document: ``a/b.md`` -> ``a/b/``, ``a/index.md`` -> ``a/``."""
    stem = document.with_suffix("")
    folder = stem.parent if stem.name == "index" else stem
    return "" if folder == Path(".") else folder.as_posix() + "/"


def offline_context(browser):
    """A browser context whose requests off localhost are aborted and listed in the returned list."""
    leaks: list[str] = []

    def route(request_route) -> None:
        url = urlparse(request_route.request.url)
        if url.scheme in ("http", "https") and url.hostname not in LOCAL_HOSTS:
            leaks.append(request_route.request.url)
            request_route.abort()
        else:
            request_route.continue_()

    context = browser.new_context(viewport=DESKTOP)
    context.add_init_script(OPEN_SHADOW_ROOTS)
    context.route("**/*", route)
    return context, leaks


def console_errors(page) -> list[str]:
    """A list that fills with the page's console errors and uncaught exceptions."""
    errors: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    return errors


def test_site_has_a_page_per_trace_document(docs: Path, site: Path) -> None:
    documents = [p.relative_to(docs) for p in docs.rglob("*.md")]
    require(len(documents) >= 2, "traces/ holds no trace documents: run `sentinel trace`")
    assert page_paths(site) == sorted(url_of(d) for d in documents)


def test_no_page_shows_raw_markup_or_a_commit_that_is_no_id(site: Path) -> None:
    """Every admonition rendered (no ``!!! warning`` text), no docstring's Sphinx role shows as text, and every
    commit a page's header or record line names is a commit id (the built HTML, no browser)."""
    pages = {path: (site / path / "index.html").read_text() for path in page_paths(site)}
    shown = {path: article_text(text) for path, text in pages.items()}
    assert {path: unrendered(text) for path, text in shown.items() if unrendered(text)} == {}
    lines = {path: [line.strip() for line in article_text(text, ("pre", "script", "style")).splitlines()
                    if re.match(r"\s*(Commit:|Record )", line)] for path, text in pages.items()}
    assert sum(map(len, lines.values())) >= 10, "no header names a commit"
    assert {path: commits_not_ids(found) for path, found in lines.items() if commits_not_ids(found)} == {}
    assert unrendered('!!! warning "STALE" x :class:`SinkhornKnopp`') == ["!!! warning", ":class:"]
    assert commits_not_ids(["Commit: ref: refs/heads/main", "Commit: `180963c`"]) == ["Commit: ref: refs/heads/main"]


@pytest.mark.slow  # a browser over every page of the built site: ~1.5 min
def test_every_page_renders_offline(docs: Path, site: Path, base_url: str, browser) -> None:
    """Every diagram is an SVG showing every label of its source; no console error; no request off localhost. At
    1400 x 900 no page scrolls sideways (nor any table or code block in it), no markup shows raw and every commit
    named in a header or record line is a commit id."""
    context, leaks = offline_context(browser)
    screenshots = os.environ.get("SENTINEL_SCREENSHOTS")
    diagrams = plots = 0
    for path in page_paths(site):
        page = context.new_page()
        errors = console_errors(page)
        page.goto(base_url + path, wait_until="networkidle")
        broken = page.evaluate("() => [...document.images].filter(i => !(i.complete && i.naturalWidth > 0))"
                               ".map(i => i.src)")
        assert not broken, f"{path}: images that did not load: {broken}"
        if path.startswith("guide/benchmarks/"):
            plots += page.evaluate("() => document.images.length")
        sources = [html.unescape(s) for s in MERMAID_BLOCK.findall((site / path / "index.html").read_text())]
        if sources:
            page.wait_for_function("n => document.querySelectorAll('div.mermaid').length >= n", arg=len(sources))
            page.wait_for_function(f"() => ({RENDERED_SVG_TEXT})().every(t => t !== null)")
        rendered = page.evaluate(RENDERED_SVG_TEXT)
        assert len(rendered) == len(sources), f"{path}: {len(rendered)} diagrams rendered, {len(sources)} in the page"
        for source, svg_text in zip(sources, rendered):
            labels = [label for line in source.splitlines() if not line.lstrip().startswith("click")
                      for label in re.findall(r'"([^"]+)"', line)]  # a click line's quotes are a link and a tooltip
            missing = [label for label in labels if label not in svg_text]
            assert not missing, f"{path}: diagram rendered without the labels {missing}"
        diagrams += len(sources)
        assert not page.evaluate(SIDEWAYS), f"{path}: scrolls sideways at 1400 px: {page.evaluate(SIDEWAYS)}"
        assert not unrendered(page.evaluate(PROSE)), f"{path}: raw markup {unrendered(page.evaluate(PROSE))}"
        assert not commits_not_ids(page.evaluate(COMMITS)), f"{path}: {commits_not_ids(page.evaluate(COMMITS))}"
        if screenshots:
            Path(screenshots).mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(Path(screenshots) / f"{path.strip('/').replace('/', '-') or 'index'}.png"),
                            full_page=True)
        assert not errors, f"{path}: console errors {errors}"
        page.close()
    context.close()
    assert diagrams >= 2, "the trace site shows no Mermaid diagram"
    benchmark_pages = (docs / "guide" / "benchmarks").glob("*.md")
    assert plots == sum(p.read_text().count("\n![") for p in benchmark_pages), "benchmark plots missing from pages"
    assert not leaks, f"requests left localhost: {sorted(set(leaks))}"


def test_search_and_palette_toggle_work_offline(base_url: str, browser) -> None:
    context, leaks = offline_context(browser)
    page = context.new_page()
    errors = console_errors(page)
    page.goto(base_url, wait_until="networkidle")
    meta = page.locator(".md-search-result__meta")
    page.wait_for_function("m => !m.textContent.includes('Initializing')", arg=meta.element_handle())  # index loaded
    page.locator("input.md-search__input").press_sequentially("viterbi")  # material searches on key events
    page.wait_for_selector(".md-search-result__item")
    assert "viterbi" in page.inner_text(".md-search-result__list").lower()
    page.keyboard.press("Escape")
    before = page.get_attribute("body", "data-md-color-scheme")
    page.click("form[data-md-component='palette'] label:visible")
    page.wait_for_function("s => document.body.getAttribute('data-md-color-scheme') !== s", arg=before)
    assert {before, page.get_attribute("body", "data-md-color-scheme")} == {"default", "slate"}
    assert not errors, f"console errors {errors}"
    context.close()
    assert not leaks, f"requests left localhost: {sorted(set(leaks))}"


SVG_LINKS = """() => [...document.querySelectorAll("div.mermaid")]
    .flatMap(d => [...d.shadowRoot.querySelectorAll("a")])
    .map(a => [a.textContent.trim(),
               new URL(a.getAttribute("href") || a.getAttribute("xlink:href"), location.href).href])"""
MATRIX = """() => [...document.querySelectorAll("table")]
    .filter(t => t.tHead && [...t.tHead.rows[0].cells].some(c => c.textContent.trim() === "route"))
    .map(t => [...t.tBodies[0].rows].map(r => [...r.cells].map(c => c.textContent.trim())))"""
GLANCE = """() => [...document.querySelectorAll("table")]
    .filter(t => t.tHead && [...t.tHead.rows[0].cells].some(c => c.textContent.trim() === "routes passed"))
    .map(t => [...t.tBodies[0].rows].map(r => [...r.cells].map(c => c.textContent.trim())))"""
# table cells whose status word has no SVG icon next to it, and route ids (code in tables) laid out on several lines
ICONLESS = """() => [...document.querySelectorAll("td")]
    .filter(td => /\\b(pass|fail|stale|not run)\\b/.test(td.textContent) && !td.querySelector(".twemoji svg")
                  && !/^(n\\/a|not measured)$/.test(td.textContent.trim()) && !td.querySelector("a code"))
    .map(td => td.textContent.trim())"""
WRAPPED_IDS = """() => [...document.querySelectorAll("td code")]
    .filter(c => c.getClientRects().length > 1 || c.getBoundingClientRect().height
                 > 1.6 * parseFloat(getComputedStyle(c).lineHeight || getComputedStyle(c).fontSize))
    .map(c => c.textContent)"""


@pytest.mark.slow  # every link of the home matrix and diagrams in a browser: ~4 min
def test_home_matrix_and_diagram_leaf_links_resolve(site: Path, base_url: str, browser) -> None:
    """The home page's matrix has a row per route of every family with a status per device; on every family page
    each leaf of the decision tree is a link whose target page has the route's anchor."""
    from kernel_sentinel import registry

    routes = [r.id for f in registry.families() for r in f.routes()]
    context, leaks = offline_context(browser)
    page = context.new_page()
    page.goto(base_url, wait_until="networkidle")
    (matrix,) = page.evaluate(MATRIX)
    assert sorted(row[1] for row in matrix) == sorted(routes)
    statuses = ("pass", "fail", "stale", "not run")
    assert all(any(s in cell for s in statuses) for row in matrix for cell in row[2:-2]), matrix
    checked = 0
    for path in [p for p in page_paths(site) if any(p.startswith(f"{f.name}/") for f in registry.families())]:
        page.goto(base_url + path, wait_until="networkidle")
        page.wait_for_function(f"() => ({RENDERED_SVG_TEXT})().every(t => t !== null)")
        links = page.evaluate(SVG_LINKS)
        source = "".join(MERMAID_BLOCK.findall((site / path / "index.html").read_text()))
        leaves = re.findall(r'\(\["([^"]+)"\]\)', html.unescape(source))
        assert sorted(label for label, _ in links) == sorted(leaves), path
        for label, href in links:
            target, _, anchor = href.partition("#")
            assert target.startswith(base_url) and anchor, href
            page.goto(target, wait_until="domcontentloaded")
            assert page.evaluate("id => document.getElementById(id) !== null", anchor), f"{path}: {label} -> {href}"
            checked += 1
    context.close()
    assert checked >= len(routes), "fewer leaf links than routes"
    assert not leaks, f"requests left localhost: {sorted(set(leaks))}"


# the home page's family x device grid: its rows' cells (text and computed background) and its box
GRID = """() => { const t = [...document.querySelectorAll("table")].find(t => t.tHead
        && [...t.tHead.rows[0].cells].map(c => c.textContent.trim()).join("|").startsWith("family|CPU"));
    if (!t) return null;
    const box = t.getBoundingClientRect();
    let block = t;  // the table's outermost wrapper in the page's content (the theme's wrappers vary by version)
    while (block.parentElement && !block.parentElement.classList.contains("md-typeset")) block = block.parentElement;
    const headline = block.previousElementSibling.getBoundingClientRect();
    return {bottom: box.bottom, right: box.right, headline: headline.top,
            cells: [...t.tBodies[0].rows].map(r => [...r.cells].map(c => {
                const span = c.querySelector("span[class^=sentinel-]");
                return [c.textContent.trim(), span ? getComputedStyle(span).backgroundColor : ""]; }))}; }"""


@pytest.mark.parametrize("width", [1400, 800])
def test_home_page_answers_is_it_green_in_one_screen(base_url: str, browser, width: int, tmp_path: Path,
                                                    record_property) -> None:
    """The home page opens with a headline and a family x device grid, every cell coloured by its status, both in
    the first 1400 x 900 screen, nothing scrolling sideways; then one row per family and recorded device. Its
    status words carry the theme's SVG icons (no emoji font needed) and no route id wraps mid-word, at a desktop
    and a narrow width. The screenshot's path is printed and recorded as a property of the test's report
    (``SENTINEL_SCREENSHOTS=DIR`` keeps it there)."""
    from kernel_sentinel import registry

    context, leaks = offline_context(browser)
    page = context.new_page()
    page.set_viewport_size({**DESKTOP, "width": width})
    page.goto(base_url, wait_until="networkidle")
    grid = page.evaluate(GRID)
    assert grid is not None, "no family x device grid on the home page"
    assert sorted(row[0][0] for row in grid["cells"]) == sorted(f.name for f in registry.families())
    colours = {text.split()[0]: colour for row in grid["cells"] for text, colour in row[1:-1]}
    assert colours and all(colour not in ("", "rgba(0, 0, 0, 0)") for colour in colours.values()), grid
    assert len(set(colours.values())) == len(colours), f"statuses share a colour: {colours}"
    if width == DESKTOP["width"]:
        assert grid["bottom"] <= DESKTOP["height"] and grid["right"] <= width, f"the grid is off the screen: {grid}"
        assert grid["headline"] < grid["bottom"]
        assert not page.evaluate(SIDEWAYS), page.evaluate(SIDEWAYS)
    (glance,) = page.evaluate(GLANCE)
    assert sorted({row[0] for row in glance}) == sorted(f.name for f in registry.families())
    assert all(row[2].split()[0].lower() in ("pass", "fail", "stale") for row in glance), glance
    assert page.evaluate("() => document.querySelectorAll('td .twemoji svg').length") >= len(glance)
    assert not page.evaluate(ICONLESS), "status words without an SVG icon"
    assert not page.evaluate(WRAPPED_IDS), "route ids wrapped over several lines"
    folder = Path(os.environ.get("SENTINEL_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    shot = folder / f"home-{width}px.png"
    page.screenshot(path=str(shot), full_page=False)
    print(f"screenshot of the home page at {width} px: {shot}")
    record_property(f"screenshot_{width}px", str(shot))  # in the test report (--junitxml) too
    assert shot.stat().st_size > 10_000
    context.close()
    assert not leaks, f"requests left localhost: {sorted(set(leaks))}"
