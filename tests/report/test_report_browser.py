"""The HTML report in a real browser: headless Chromium opens the file, every plot renders (plotly drew its SVG and
its traces), the console has no error, nothing is fetched, and the screenshot is not blank.

Needs Debian's ``chromium`` and ``chromium-driver``; skipped where they are missing unless
``STRUCTSPEC_REQUIRE_BROWSER=1`` (``.ci/run`` installs them and sets it). ``STRUCTSPEC_SCREENSHOT=path`` keeps the
screenshot (the one in the docs was made so)."""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from structspec.cli import app
from tests.report.traffic import PLOTS, write_store

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
REQUIRED = os.environ.get("STRUCTSPEC_REQUIRE_BROWSER") == "1"

pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER) and not REQUIRED,
                                reason="needs chromium and chromium-driver (apt-get install chromium chromium-driver)")

RENDERED = """return Array.from(document.querySelectorAll('.js-plotly-plot')).map(el => ({
    id: el.id, svg: el.querySelectorAll('.main-svg').length, data: (el._fullData || []).length,
    drawn: el.querySelectorAll('.trace, .shapelayer path').length,
    note: Array.from(el.querySelectorAll('.annotation-text')).map(a => a.textContent).join('|')}))"""


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    data = write_store(tmp_path_factory.mktemp("traffic"))
    out = data / "report.html"
    result = CliRunner().invoke(app, ["stats", "report", "--data-dir", str(data), "--window", "2d", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    assert CHROMIUM and DRIVER, "STRUCTSPEC_REQUIRE_BROWSER=1 but chromium or chromedriver is missing"
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1400,1800",
                "--hide-scrollbars"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def test_every_plot_renders_without_errors_or_fetches(report: Path, browser) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(report.as_uri())
    WebDriverWait(browser, 60).until(lambda d: len([p for p in d.execute_script(RENDERED) if p["svg"]]) >= PLOTS)
    plots = browser.execute_script(RENDERED)
    assert len(plots) == PLOTS and all(p["svg"] >= 1 for p in plots), plots
    # every plot drew its traces, or says why it has none (the short-output schema never drafted)
    empty = {p["id"].split("-1-")[-1] for p in plots if p["data"] == 0}
    assert empty == {"acceptance-by-bucket", "acceptance-by-position"}, plots
    assert all(p["drawn"] >= 1 for p in plots if p["data"]) and all("no drafts" in p["note"] for p in plots
                                                                    if not p["data"])
    invoice = {p["id"].split("-1-")[-1]: p for p in plots if "invoice" in p["id"]}
    assert len(invoice) == 5 and all(p["data"] for p in invoice.values())
    # two proposers' lines, the switched-off and switched-on markers; the threshold line is a shape
    assert invoice["acceptance-over-time"]["data"] == 4 and "threshold 0.55" in invoice["acceptance-over-time"]["note"]
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert errors == [], errors
    fetched = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    assert fetched == [], fetched  # a self-contained file: no script, style or font fetched

    from PIL import Image

    png = browser.get_screenshot_as_png()
    image = Image.open(io.BytesIO(png)).convert("L")
    assert image.size[0] >= 1000
    histogram = image.histogram()
    not_white = sum(histogram[:240]) / sum(histogram)
    assert not_white > 0.03 and image.getextrema()[0] < 80, not_white  # lines, text and bars were drawn
    keep = os.environ.get("STRUCTSPEC_SCREENSHOT")
    if keep:
        Path(keep).write_bytes(png)


def test_a_broken_page_is_caught(report: Path, browser, tmp_path: Path) -> None:
    """The checks have power: a page whose script fails shows a console error and draws no plot."""
    broken = tmp_path / "broken.html"
    broken.write_text(report.read_text().replace("Plotly.newPlot(", "Plotly.noSuchCall(", 1))
    browser.get_log("browser")  # drop what the earlier page logged
    browser.get(broken.as_uri())
    browser.implicitly_wait(0)
    plots = browser.execute_script(RENDERED)
    assert len([p for p in plots if p["svg"]]) == PLOTS - 1
    assert any(e["level"] == "SEVERE" for e in browser.get_log("browser"))
