"""The planning page in a real browser: headless Chromium drives plan -> what-if -> compare against the
real service (`moment serve` on a free port) and checks what the page shows, taking screenshots.

Skipped with the reason where selenium, Chromium or chromedriver is missing. Screenshots go to the
test's tmp dir, and also to $MOMENT_WEB_SHOTS when set (to look at them)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[dev]')")
pytest.importorskip("fastapi", reason="the service's dependencies are not installed")
pytest.importorskip("uvicorn", reason="the service's dependencies are not installed")

from selenium.common.exceptions import TimeoutException  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _find(names: list[str], env: str) -> str | None:
    if os.environ.get(env):
        return os.environ[env]
    for n in names:
        path = shutil.which(n)
        if path:
            return path
    return None


CHROMIUM = _find(["chromium", "chromium-browser", "google-chrome"], "MOMENT_CHROMIUM")
CHROMEDRIVER = _find(["chromedriver"], "MOMENT_CHROMEDRIVER")
pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no Chromium browser on PATH (Debian: apt-get install chromium)"),
    pytest.mark.skipif(CHROMEDRIVER is None,
                       reason="no chromedriver on PATH (Debian: apt-get install chromium-driver)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _post(url: str, body: dict, timeout: float = 60.0):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """`moment serve` on a free loopback port, as a user starts it; its base URL ($MOMENT_WEB_URL: a
    service already running)."""
    if os.environ.get("MOMENT_WEB_URL"):
        yield os.environ["MOMENT_WEB_URL"].rstrip("/") + "/"
        return
    port = _free_port()
    data = tmp_path_factory.mktemp("service-data")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    log = open(data / "serve.log", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "moment", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--data-dir", str(data)], stdout=log, stderr=subprocess.STDOUT, env=env,
                            cwd=data, start_new_session=True)
    base = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 30
    try:
        while True:
            try:
                if _get(base + "v1/health", timeout=1).get("status") == "ok":
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"moment serve did not come up on port {port}:\n{log.read()[-2000:]}")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def browser():
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1440,1000", "--hide-scrollbars", "--force-device-scale-factor=1"):
        opts.add_argument(a)
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    drv.set_page_load_timeout(30)
    yield drv
    drv.quit()


class Shots:
    """Full-page screenshots into the tmp dir (and $MOMENT_WEB_SHOTS)."""

    def __init__(self, driver, out: Path):
        self.driver, self.out = driver, out
        self.extra = Path(os.environ["MOMENT_WEB_SHOTS"]) if os.environ.get("MOMENT_WEB_SHOTS") else None
        self.taken: list[Path] = []

    def __call__(self, name: str) -> Path:
        d = self.driver
        width, height = d.execute_script(
            "return [document.documentElement.scrollWidth, document.documentElement.scrollHeight]")
        shot = d.execute_cdp_cmd("Page.captureScreenshot", {
            "format": "png", "captureBeyondViewport": True,
            "clip": {"x": 0, "y": 0, "width": width, "height": min(height, 6000), "scale": 1}})
        path = self.out / f"{len(self.taken) + 1:02d}-{name}.png"
        path.write_bytes(base64.b64decode(shot["data"]))
        if self.extra:
            self.extra.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, self.extra / path.name)
        self.taken.append(path)
        return path


def _wait(driver, cond, what: str, timeout: float = 30):
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.05).until(lambda d: cond(d))
    except TimeoutException:
        err = driver.find_elements(By.ID, "error")
        shown = err[0].text if err and err[0].is_displayed() else "(no error shown)"
        pytest.fail(f"timed out waiting for {what}; the page's error box: {shown}")


def _css(driver, sel: str):
    return driver.find_element(By.CSS_SELECTOR, sel)


def _idle(driver) -> bool:
    return not driver.find_element(By.ID, "busy").is_displayed()


def _overflowing(driver) -> list[str]:
    """Elements wider than their card, tables that need a sideways scroll at 1440 px."""
    return driver.execute_script("""
        const bad = [];
        if (document.documentElement.scrollWidth > window.innerWidth + 1) bad.push('page is wider than the window');
        for (const c of document.querySelectorAll('.card')) {
          if (c.offsetParent === null) continue;
          for (const e of c.querySelectorAll('*')) {
            if (e.closest('.scroll')) continue;
            const r = e.getBoundingClientRect(), rc = c.getBoundingClientRect();
            if (r.width && r.right > rc.right + 1) { bad.push(e.tagName + '.' + e.className + ' in ' + (c.id || c.className)); break; }
          }
        }
        for (const s of document.querySelectorAll('.scroll')) {
          if (s.offsetParent !== null && s.scrollWidth > s.clientWidth + 1) bad.push('a table scrolls sideways in ' + s.parentElement.id);
        }
        return bad;""")


def _epoch_text(driver, side: str) -> str:
    return driver.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText.trim() : null",
        f".head.col-{side} [data-kpi=epoch] .kpi-val")


def _side_text(driver, side: str) -> str:
    """All the text of one side's cards (the plan, or the what-if), read in one go (the page may redraw)."""
    return driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((c) => c.innerText).join('\\n')",
        f"#results .col-{side}")


def test_plan_whatif_compare_in_chromium(service, browser, tmp_path):
    d = browser
    shots = Shots(d, tmp_path)
    d.get(service)
    _wait(d, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1",
          "the page to load the machines and models")
    assert "paper-machine-b" in [o.text for o in Select(_css(d, "#profile")).options]
    shots("start")

    # ---- plan: paper-machine-b with 4 A100s and 8 P5510s ----
    Select(_css(d, "#profile")).select_by_value("paper-machine-b")
    gpus = _css(d, "#gpus")
    gpus.clear()
    gpus.send_keys("4")
    Select(_css(d, "#ssd-model")).select_by_value("P5510")
    _css(d, "#plan-btn").click()
    _wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, ".col-original [data-kpi=epoch]") and _idle(d),
          "the plan to show")
    expected = _post(service + "v1/plan", {"profile": "paper-machine-b", "gpus": 4, "ssds": 8})
    assert _epoch_text(d, "original") == f"{expected['predicted']['epoch_read_s']:.2f} s"
    assert expected["machine"] in _side_text(d, "original") and expected["inventory"] in _side_text(d, "original")
    # the recommended placement: every device in the slot the planner chose
    rows = {tuple(td.text for td in tr.find_elements(By.TAG_NAME, "td"))[:2]
            for tr in d.find_elements(By.CSS_SELECTOR, ".col-original [data-testid=placement] tbody tr")}
    assert rows == {(dev, slot) for slot, dev in expected["devices"].items()}
    # the reason in words, and the usual layouts with their epoch times
    assert _css(d, ".col-original [data-testid=why]").text.lower().startswith(
        expected["explanation"][0]["text"][:40].lower())
    base_rows = d.find_elements(By.CSS_SELECTOR, ".col-original [data-testid=baselines] tbody tr")
    assert len(base_rows) == 1 + len(expected["baselines"])
    shown = {r.find_elements(By.TAG_NAME, "td")[0].text: r.find_elements(By.TAG_NAME, "td")[1].text
             for r in base_rows[1:]}
    assert shown == {b["name"]: f"{b['predicted']['epoch_read_s']:.2f}" for b in expected["baselines"]}
    # per-GPU bandwidth bars, one per GPU, as wide as the bandwidth
    bars = d.find_elements(By.CSS_SELECTOR, ".col-original [data-testid=bars] .bar-row")
    assert len(bars) == 4
    assert all(f"{v:.2f} GB/s" in b.text for b, v in zip(bars, expected["predicted"]["per_gpu_inlet_gbps"]))
    assert all(b.find_element(By.CSS_SELECTOR, ".bar-fill").size["width"] > 20 for b in bars)
    # the diagram (the service's SVG) is drawn
    img = _css(d, ".col-original img.diagram")
    _wait(d, lambda d: d.execute_script("return arguments[0].complete && arguments[0].naturalWidth", img),
          "the diagram to load", timeout=10)
    assert img.size["width"] > 300 and img.size["height"] > 200
    assert _overflowing(d) == []
    shots("plan")

    # ---- what-if: faster SSDs and a faster socket link ----
    assert _css(d, "#whatif-fields").is_enabled()
    Select(_css(d, "#wi-ssd-model")).select_by_value("PM1743")
    target = Select(_css(d, "#wi-target"))
    qpi = next(o for o in target.options if "QPI" in o.text)
    target.select_by_visible_text(qpi.text)
    Select(_css(d, "#wi-prop")).select_by_value("bandwidth_gbps")
    val = _css(d, "#wi-value")
    val.clear()
    val.send_keys("40")
    _css(d, "#wi-add").click()
    changes = [li.text for li in d.find_elements(By.CSS_SELECTOR, "#wi-changes li code")]
    assert changes == ["links.0.bandwidth_gbps=40"]
    _css(d, "#whatif-btn").click()
    _wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, ".col-whatif [data-kpi=epoch]") and _idle(d),
          "the what-if column")
    # side by side: each card of the what-if right of the same card of the plan, on the same row
    left = d.find_elements(By.CSS_SELECTOR, "#results .col-original")
    right = d.find_elements(By.CSS_SELECTOR, "#results .col-whatif")
    assert len(left) == len(right) >= 5
    for a, b in zip(left, right):
        assert b.location["x"] >= a.location["x"] + a.size["width"] and abs(b.location["y"] - a.location["y"]) < 2
    before, after = _epoch_text(d, "original"), _epoch_text(d, "whatif")
    assert before != after
    assert float(after.split()[0]) < float(before.split()[0])   # 13 GB/s drives and a wider socket link
    delta = _css(d, ".col-whatif [data-testid=delta]")
    assert "faster" in delta.get_attribute("class") and "faster" in delta.text
    assert before.split()[0] in delta.text and after.split()[0] in delta.text
    assert "PM1743" in _side_text(d, "whatif") and "links.0.bandwidth_gbps=40" in _side_text(d, "whatif")
    assert len(d.find_elements(By.CSS_SELECTOR, ".col-whatif [data-testid=bars] .bar-row")) == 4
    assert _overflowing(d) == []
    shots("whatif")

    # ---- a bad override: the service's 422 is shown in words ----
    raw = _css(d, "#wi-raw")
    raw.send_keys("nodes.no-such-switch.link.gen=5")
    _css(d, "#wi-raw-add").click()
    _css(d, "#whatif-btn").click()
    _wait(d, lambda d: _css(d, "#error").is_displayed() and _idle(d), "the error message")
    err = _css(d, "#error").text
    assert "422" in err and "no-such-switch" in err, err
    assert _epoch_text(d, "whatif") == after     # the last good what-if stays
    shots("error")
    d.find_elements(By.CSS_SELECTOR, "#wi-changes li .x")[-1].click()
    _css(d, "#error .close").click()
    # a 422 with a hint: both lines are shown
    _css(d, "#inventory").send_keys("2xNoSuchGPU")
    _css(d, "#plan-btn").click()
    _wait(d, lambda d: _css(d, "#error").is_displayed() and _idle(d), "the inventory error")
    err = _css(d, "#error").text
    assert "422" in err and "NoSuchGPU" in err and "hint: known models" in err, err
    _css(d, "#inventory").clear()
    _css(d, "#error .close").click()

    # ---- compare machines with the same inventory ----
    for cb in d.find_elements(By.CSS_SELECTOR, "#compare-list input"):
        if cb.is_selected() != (cb.get_attribute("value") in ("paper-machine-a", "paper-machine-b")):
            cb.click()
    _css(d, "#compare-btn").click()
    _wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-testid=compare] tbody tr") and _idle(d),
          "the comparison")
    rows = d.find_elements(By.CSS_SELECTOR, "[data-testid=compare] tbody tr")
    by_name = {r.find_elements(By.TAG_NAME, "td")[0].text.split("\n")[0]: r.find_elements(By.TAG_NAME, "td")
               for r in rows}
    assert set(by_name) == {"paper-machine-a", "paper-machine-b"}
    # the same machine and inventory as the plan: the same epoch time
    assert by_name["paper-machine-b"][2].text == before.split()[0]
    assert not _css(d, "#error").is_displayed()
    assert _overflowing(d) == []
    shots("compare")

    # ---- what to buy under a budget, then plan the best buy ----
    for box, keep in (("#budget-gpus", "A100-PCIe-40GB"), ("#budget-ssds", "P5510")):
        for cb in d.find_elements(By.CSS_SELECTOR, f"{box} input"):
            if cb.is_selected() != (cb.get_attribute("value") == keep):
                cb.click()
    for sel, v in (("#budget", "60000"), ("#budget-max-gpus", "2"), ("#budget-max-ssds", "4")):
        _css(d, sel).clear()
        _css(d, sel).send_keys(v)
    _css(d, "#advise-btn").click()
    _wait(d, lambda d: d.find_elements(By.CSS_SELECTOR, "[data-testid=pick]") and _idle(d), "the buying advice")
    pick = d.find_elements(By.CSS_SELECTOR, "[data-testid=pick]")[0]
    best = pick.find_element(By.TAG_NAME, "h4").text
    assert "A100-PCIe-40GB" in best and "P5510" in best, best
    epoch_s = pick.find_element(By.XPATH, ".//dt[.='epoch read']/following-sibling::dd[1]").text
    advice_rows = d.find_elements(By.CSS_SELECTOR, "[data-testid=advise] tbody tr")
    assert advice_rows and best in advice_rows[0].text
    assert "$" in pick.text and "samples/s" in pick.text
    assert _overflowing(d) == []
    shots("advise")
    pick.find_element(By.TAG_NAME, "button").click()
    _wait(d, lambda d: _css(d, "#inventory").get_attribute("value") and _idle(d)
          and d.find_elements(By.CSS_SELECTOR, ".head.col-original") and not d.find_elements(By.CSS_SELECTOR, ".col-whatif"),
          "the plan of the advised inventory")
    # the planner's epoch for the advised inventory is the one the advice priced
    assert _epoch_text(d, "original") == epoch_s
    assert best in _side_text(d, "original")

    # ---- an uploaded machine ----
    prof = tmp_path / "tiny-server.yaml"
    prof.write_text(TINY_PROFILE)
    _css(d, "input[name=source][value=upload]").click()
    _css(d, "#profile-file").send_keys(str(prof))
    _wait(d, lambda d: "tiny-server.yaml" in _css(d, "#upload-desc").text, "the upload to be read")
    _css(d, "#inventory").clear()
    for sel, v in (("#gpus", "2"), ("#ssds", "2")):
        _css(d, sel).clear()
        _css(d, sel).send_keys(v)
    _css(d, "#plan-btn").click()
    _wait(d, lambda d: "tiny-server" in _side_text(d, "original") and _idle(d), "the uploaded machine's plan")
    assert "2 x A100-PCIe-40GB, 2 x P5510" in _side_text(d, "original")
    targets = [o.text for o in Select(_css(d, "#wi-target")).options]
    assert any("sw0" in t for t in targets) and any("cpu0 ↔ cpu1" in t for t in targets), targets
    assert not _css(d, "#error").is_displayed()
    shots("upload")
    assert all(p.stat().st_size > 10_000 for p in shots.taken)


TINY_PROFILE = """\
name: tiny-server
nodes:
  - {id: cpu0, kind: socket}
  - {id: cpu1, kind: socket}
  - {id: rc0, kind: root_complex, parent: cpu0}
  - {id: rc1, kind: root_complex, parent: cpu1}
  - {id: sw0, kind: switch, parent: rc0, link: {gen: 4, width: 16}}
  - {id: slot1, kind: slot, parent: sw0, width: 16, link: {gen: 4, width: 16}}
  - {id: slot2, kind: slot, parent: sw0, width: 16, link: {gen: 4, width: 16}}
  - {id: slot3, kind: slot, parent: rc1, width: 16, link: {gen: 4, width: 16}}
  - {id: bay0, kind: slot, parent: rc0, width: 4, accepts: [ssd], link: {gen: 4, width: 4}}
  - {id: bay1, kind: slot, parent: rc1, width: 4, accepts: [ssd], link: {gen: 4, width: 4}}
links:
  - {a: cpu0, b: cpu1, kind: upi, count: 2, gts: 16}
"""
