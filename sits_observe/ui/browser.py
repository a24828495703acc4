"""Headless Chromium for ``bench ui`` and the end-to-end test: start it, time renders, take screenshots.

A probe script runs in every page: it notes when the page's graphs have drawn their data (first render,
from the start of navigation) and, for each live update, the time from the update's request to the last redraw
it caused, with the response size.  Needs selenium (the ``[test]`` extra) and Debian's ``chromium`` and
``chromium-driver``.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

from ..errors import SitsError

__all__ = ["FLAGS", "chromium", "load_page", "wait_updates", "screenshot", "png_size"]

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-dev-shm-usage")

# Runs before any page script.  Live updates are the page's own interval callbacks (ids "<page>-tick").
PROBE = r"""
window.__sits = {graphs: 0, drawn: [], updates: [], open: null};
(function () {
  const origFetch = window.fetch;
  const tick = /"changedPropIds":\["(?!status-)[a-z]+-tick\.n_intervals"\]/;
  window.fetch = function (url, opts) {
    const body = opts && typeof opts.body === 'string' ? opts.body : '';
    if (!tick.test(body)) return origFetch.apply(this, arguments);
    const u = {start: performance.now(), response: null, end: null, bytes: null};
    window.__sits.open = u;
    window.__sits.updates.push(u);
    return origFetch.apply(this, arguments).then(function (r) {
      r.clone().text().then(function (t) { u.bytes = t.length; });
      u.response = performance.now();
      return r;
    });
  };
  let quiet = 0;  // frames without a new graph drawn: after a second of them, look only twice a second
  function watch() {
    let drawn = 0;
    for (const g of document.getElementsByClassName('js-plotly-plot')) {
      if (!g.__sitsDrawn && g._fullLayout && g.querySelector('.overplot image, .overplot path')) g.__sitsDrawn = true;
      if (g.__sitsDrawn) drawn += 1;
      if (!g.__sitsHooked && g.on) {
        g.__sitsHooked = true;
        g.on('plotly_afterplot', function () {
          const u = window.__sits.open;
          if (u && u.response !== null) u.end = performance.now();
        });
      }
    }
    if (drawn > window.__sits.graphs) { window.__sits.drawn.push([performance.now(), drawn]); quiet = 0; }
    window.__sits.graphs = drawn;
    if (++quiet < 60) requestAnimationFrame(watch); else setTimeout(watch, 500);
  }
  requestAnimationFrame(watch);
})();
"""


def chromium(profile: Path, *, binary: str = "/usr/bin/chromium", driver: str = "/usr/bin/chromedriver",
             size: tuple[int, int] = (1400, 1000)) -> Any:
    """A headless Chromium with a fresh profile in ``profile`` and the probe installed."""
    try:
        from selenium import webdriver
        from selenium.common.exceptions import WebDriverException
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        raise SitsError("selenium is not installed: pip install 'sits-observe[test]'") from None
    for path, pkg in ((binary, "chromium"), (driver, "chromium-driver")):
        if not Path(path).exists():
            raise SitsError(f"{path} not found: install Debian's {pkg} (make test does)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for flag in (*FLAGS, f"--user-data-dir={profile}", f"--window-size={size[0]},{size[1]}"):
        opts.add_argument(flag)
    try:
        d = webdriver.Chrome(service=Service(driver), options=opts)
    except WebDriverException as exc:
        raise SitsError(f"chromium did not start: {exc.msg}") from exc
    d.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": PROBE})
    return d


def load_page(d: Any, url: str, graphs: int, timeout: float = 30.0) -> float:
    """Open ``url``; milliseconds from navigation start until ``graphs`` graphs have drawn their data."""
    d.get(url)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        drawn = d.execute_script("return window.__sits ? window.__sits.drawn : [];")
        done = [t for t, n in drawn if n >= graphs]
        if done:
            return float(done[0])
        time.sleep(0.05)
    raise SitsError(f"{url}: {graphs} graphs not drawn within {timeout:g} s")


def wait_updates(d: Any, n: int, timeout: float) -> list[dict[str, float]]:
    """Wait for ``n`` completed live updates after now; each ``{"ms", "server_ms", "bytes"}``."""
    skip = d.execute_script("return window.__sits.updates.length;")
    deadline = time.monotonic() + timeout
    done: list[dict[str, float]] = []
    while time.monotonic() < deadline and len(done) < n:
        time.sleep(0.2)
        ups = d.execute_script("return window.__sits.updates;")[skip:]
        # an update is complete once a newer one has started (its last redraw is then known)
        done = [{"ms": u["end"] - u["start"], "server_ms": u["response"] - u["start"], "bytes": u["bytes"]}
                for u in ups[:-1] if u["end"] is not None and u["bytes"] is not None]
    return done[:n]


def screenshot(d: Any, path: Path) -> dict[str, int]:
    """Save a PNG of the page; its size in bytes and pixels."""
    path.parent.mkdir(parents=True, exist_ok=True)
    d.save_screenshot(str(path))
    w, h = png_size(path)
    return {"bytes": path.stat().st_size, "width": w, "height": h}


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    if head[:8] != b"\x89PNG\r\n\x1a\n":
        raise SitsError(f"{path}: not a PNG file")
    return struct.unpack(">II", head[16:24])
