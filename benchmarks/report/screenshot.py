"""Renders a leak report JSON (docs/leak-report.md) to HTML, or takes a page
as it is (a run's ``index.html``), and screenshots it in headless Chromium:

    python -m benchmarks screenshot REPORT.json OUT.png [--html OUT.html] [--size 1280,2000]
    python -m benchmarks screenshot DIR/index.html OUT.png [--only flame] [--size 900,600]

``--only ID`` shows only the page's section of that id (the others hidden).

Also the browser plumbing that tests/integration/test_report_html.py uses:
:func:`find_browser`, :func:`run_headless` (``--dump-dom``/``--screenshot``)
and :func:`distinct_colours` (a PNG decoder in the standard library, so no
Pillow is needed to tell a rendered page from a blank one).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib
from collections.abc import Sequence
from pathlib import Path

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Playwright's downloads (`playwright install chromium`), full browser or headless shell.
PLAYWRIGHT_GLOBS = ("chromium-*/chrome-linux*/chrome", "chromium_headless_shell-*/chrome-linux*/headless_shell")


def find_browser() -> str | None:
    """Path of a Chromium-family browser: $MEMALLOC_BROWSER, else the first of
    BROWSER_NAMES on PATH, else Playwright's newest download; None if none."""
    if os.environ.get("MEMALLOC_BROWSER"):
        return os.environ["MEMALLOC_BROWSER"]
    for name in BROWSER_NAMES:
        if shutil.which(name):
            return shutil.which(name)
    root = os.environ.get("PLAYWRIGHT_BROWSERS_PATH") or os.path.expanduser("~/.cache/ms-playwright")
    found = sorted(p for g in PLAYWRIGHT_GLOBS for p in glob.glob(os.path.join(root, g)) if os.access(p, os.X_OK))
    return found[-1] if found else None


def run_headless(browser: str, html_path: str, *args: str, timeout_s: float = 120) -> str:
    """Opens ``html_path`` (a local file) in headless ``browser`` with extra
    ``args`` (``--dump-dom``: stdout is the DOM after scripts ran;
    ``--screenshot=PNG --window-size=W,H``) and returns stdout. A fresh
    profile directory each run, so parallel runs do not share a lock.
    ``--no-sandbox`` because the sandbox cannot start as root or in most
    containers; the page is our own local file."""
    with tempfile.TemporaryDirectory(prefix="memalloc-chromium-") as profile:
        cmd = [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--no-first-run",
            "--no-default-browser-check",
            f"--user-data-dir={profile}",
            *args,
            Path(html_path).resolve().as_uri(),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return proc.stdout


def screenshot(browser: str, html_path: str, png_path: str, size: tuple[int, int] = (1280, 2000)) -> None:
    """Screenshot of the page ``html_path`` at ``size`` (CSS pixels) to ``png_path``."""
    out = os.path.abspath(png_path)
    run_headless(browser, html_path, f"--screenshot={out}", f"--window-size={size[0]},{size[1]}")
    if not os.path.exists(out):
        raise RuntimeError(f"the browser wrote no screenshot to {out}")


def png_size(path: str) -> tuple[int, int]:
    """(width, height) in pixels from the PNG's IHDR."""
    with open(path, "rb") as f:
        head = f.read(24)
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path} is not a PNG")
    return struct.unpack(">II", head[16:24])


def distinct_colours(path: str) -> int:
    """How many different pixel values an 8-bit RGB/RGBA/grey PNG (not
    interlaced) holds: 1 for a blank page, hundreds for rendered text and
    anti-aliased charts."""
    with open(path, "rb") as f:
        data = f.read()
    pos, idat, ihdr = 8, [], b""
    while pos < len(data):
        length, ctype = struct.unpack(">I4s", data[pos : pos + 8])
        chunk = data[pos + 8 : pos + 8 + length]
        ihdr = chunk if ctype == b"IHDR" else ihdr
        if ctype == b"IDAT":
            idat.append(chunk)
        pos += 12 + length
    width, height, depth, colour, _, _, interlace = struct.unpack(">IIBBBBB", ihdr)
    bpp = {0: 1, 2: 3, 4: 2, 6: 4}.get(colour)
    if depth != 8 or bpp is None or interlace:
        raise ValueError(f"unsupported PNG (depth {depth}, colour type {colour}, interlace {interlace})")
    raw, stride = zlib.decompress(b"".join(idat)), width * bpp
    prev, seen = bytearray(stride), set()
    for y in range(height):
        ftype, row = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        _unfilter(ftype, row, prev, bpp)
        pixels = bytes(row)
        seen.update(pixels[x : x + bpp] for x in range(0, stride, bpp))
        prev = row
    return len(seen)


def _unfilter(ftype: int, row: bytearray, prev: bytearray, bpp: int) -> None:
    """Undoes PNG filter ``ftype`` on ``row`` in place (``prev``: the row above, unfiltered)."""
    if ftype == 2:  # Up
        row[:] = bytes((a + b) & 0xFF for a, b in zip(row, prev))
    elif ftype in (1, 3, 4):  # Sub, Average, Paeth: left to right
        for x in range(len(row)):
            a = row[x - bpp] if x >= bpp else 0
            b, c = prev[x], (prev[x - bpp] if x >= bpp else 0)
            if ftype == 1:
                row[x] = (row[x] + a) & 0xFF
            elif ftype == 3:
                row[x] = (row[x] + ((a + b) >> 1)) & 0xFF
            else:
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                row[x] = (row[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
    elif ftype != 0:
        raise ValueError(f"bad PNG filter type {ftype}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks screenshot",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("report", help="leak report JSON (memalloc.leak_report/1), or an HTML page as it is")
    parser.add_argument("png", help="screenshot to write")
    parser.add_argument("--html", help="also keep the rendered HTML here")
    parser.add_argument("--size", default="1280,2000", help="window WIDTH,HEIGHT in CSS pixels (default 1280,2000)")
    parser.add_argument("--only", default="", help="show only the section of this id (e.g. flame)")
    args = parser.parse_args(argv)
    from memalloc.reporters.report_html import render_html

    browser = find_browser()
    if browser is None:
        raise SystemExit(
            "no Chromium found (chromium, chromium-browser, google-chrome, Playwright's); "
            "install one, e.g. apt-get install -y --no-install-recommends chromium"
        )
    if args.report.endswith((".html", ".htm")):
        with open(args.report, encoding="utf-8") as f:
            page = f.read()
    else:
        with open(args.report) as f:
            page = render_html(json.load(f))
    if args.only:  # the other sections and the footer hidden
        hide = f"<style>main > section:not(#{args.only}), main > footer {{ display:none }}</style>"
        page = page.replace("</head>", hide + "</head>", 1)
    with tempfile.TemporaryDirectory() as tmp:
        html_path = args.html or os.path.join(tmp, "report.html")
        with open(html_path, "w", encoding="utf-8") as f:
            f.write(page)
        w, h = (int(v) for v in args.size.split(","))
        screenshot(browser, html_path, args.png, (w, h))
    print(
        f"{args.png}: {w}x{h} screenshot of {len(page)} bytes of HTML, {distinct_colours(args.png)} colours ({browser})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
