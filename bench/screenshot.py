"""Screenshot of a report page: `python bench/screenshot.py REPORT_HTML OUT_PNG`.

Opens the page in headless Chromium at 1440x900, prints the page's scroll width beside the window's and fails when the
page is wider (sideways scrolling), or when a visible table box or code block scrolls sideways inside it (a folded
<details> is not visible), then saves the first screen as a PNG. A bench script, not a test: it needs
Chromium (`apt-get install chromium`, /usr/bin/chromium) and playwright (`pip install playwright`), neither of which
the test suite uses. `make screenshot REPORT=... OUT=...` runs it."""
import argparse, sys
from pathlib import Path

WIDTH, HEIGHT = 1440, 900
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


# the visible boxes wider inside than outside: their tag, inner and outer width, and the start of their text
BOXES = """[...document.querySelectorAll('.wrap, pre')]
  .filter(e => e.checkVisibility() && e.scrollWidth > e.clientWidth + 1)
  .map(e => [e.tagName, e.scrollWidth, e.clientWidth, e.textContent.slice(0, 60)])"""


def screenshot(page_path: Path, out: Path, width: int = WIDTH, height: int = HEIGHT,
               executable: str = CHROMIUM) -> tuple[int, int, list]:
    """Save the first screen of `page_path` to `out`; returns (the document's scroll width, the window's width, the
    visible boxes that scroll sideways)."""
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=executable, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.goto(page_path.resolve().as_uri(), wait_until="load")
            scroll = page.evaluate("document.documentElement.scrollWidth")
            inner = page.evaluate("window.innerWidth")
            boxes = page.evaluate(BOXES)
            page.screenshot(path=str(out), full_page=False)
        finally:
            browser.close()
    return scroll, inner, boxes


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("report_html", type=Path)
    ap.add_argument("out_png", type=Path)
    ap.add_argument("--width", type=int, default=WIDTH)
    ap.add_argument("--height", type=int, default=HEIGHT)
    ap.add_argument("--chromium", default=CHROMIUM, help=f"the browser to drive (default {CHROMIUM})")
    a = ap.parse_args(argv)
    if not a.report_html.is_file():
        print(f"screenshot: no such page: {a.report_html}", file=sys.stderr); return 2
    scroll, inner, boxes = screenshot(a.report_html, a.out_png, a.width, a.height, a.chromium)
    print(f"scrollWidth {scroll} px, window {inner} px (limit {a.width} px)")
    for tag, wide, shown, text in boxes:
        print(f"  a {tag.lower()} box scrolls sideways: {wide} px in {shown} px: {text!r}")
    if scroll > a.width or boxes:
        print(f"screenshot: the page scrolls sideways ({scroll} px; {len(boxes)} boxes inside)", file=sys.stderr)
        return 1
    print(a.out_png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
