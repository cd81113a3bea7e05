"""The report in a real browser: headless Chromium renders it to a non-blank screenshot.

Skipped where no Chromium is installed. The browser runs offline-style (no network
services, no first-run, a throw-away profile), so a page that needed a remote font,
script or image would render differently or not at all; the dumped DOM must still hold
every chart.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from rankguard.report import CHART_TITLES, load_run, render_page
from tests.factories import write_report_run

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

BROWSER = (
    shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
)


def _chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert BROWSER is not None
    cmd = [
        BROWSER,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1400,3000",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def _png_pixels(path: Path) -> tuple[int, int, bytes]:
    """Width, height and the decompressed (still filtered) scanlines of a PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, width, height = 8, b"", 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height = struct.unpack(">II", body[:8])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    return width, height, zlib.decompress(idat)


@pytest.mark.skipif(
    BROWSER is None, reason="no chromium, chromium-browser or google-chrome on PATH"
)
def test_report_renders_in_headless_chromium(tmp_path: Path) -> None:
    run_dir = write_report_run(tmp_path / "logs")
    data, _ = load_run(run_dir)
    report = tmp_path / "report.html"
    report.write_text(render_page(data), encoding="utf-8")
    shot = tmp_path / "shot.png"

    res = _chromium(tmp_path / "profile-shot", f"--screenshot={shot}", report.as_uri())
    assert shot.exists(), f"no screenshot: rc {res.returncode}\n{res.stderr[-2000:]}"
    assert shot.stat().st_size > 20_000
    width, height, pixels = _png_pixels(shot)
    assert (width, height) == (1400, 3000)
    assert len(set(pixels)) > 32, "the screenshot is one flat colour"

    dom = _chromium(tmp_path / "profile-dom", "--dump-dom", report.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count("<svg") == len(CHART_TITLES)
    for title in CHART_TITLES:
        assert title in dom.stdout, title
    assert "rank 1 &lt;b&gt;stalled&lt;/b&gt; &amp; nobody noticed" in dom.stdout
