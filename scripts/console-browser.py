#!/usr/bin/env python3
"""Drives `sasctl console` in headless Chromium, as an operator would: the task list,
one task's page (its workflow graph and timeline), completing its waiting callback step
from the page (dry run, then confirm), and the task going on to Processed. Saves a
screenshot of each stage and fails if one is blank (every pixel the same colour).

    console-browser.py URL ORDER_ID SCREENSHOT_DIR

URL is what `sasctl up` (or `sasctl console`) printed, token included. Run by
cli/tests/console_browser.rs, with the venv of scripts/browser-venv.sh and Debian's
chromium and chromium-driver (scripts/browser-deps.sh).
"""

import os
import struct
import sys
import zlib

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions as ec
from selenium.webdriver.support.ui import WebDriverWait


def png_varies(path):
    """Whether the PNG at `path` has two pixels of different colours (stops at the first)."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG")
    pos, idat, width, height, bpp = 8, [], 0, 0, 0
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
            channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(colour)
            if depth != 8 or channels is None:
                raise ValueError(f"{path}: colour type {colour} depth {depth} not handled")
            bpp = channels
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + length
    raw = zlib.decompress(b"".join(idat))
    stride = width * bpp
    prev = bytearray(stride)
    first = None
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                c = prev[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        if first is None:
            first = bytes(line[:bpp])
        if line != first * width:
            return True
        prev = line
    return False


def main():
    url, order, shots = sys.argv[1], sys.argv[2], sys.argv[3]
    base, _ = url.split("/?token=", 1)
    os.makedirs(shots, exist_ok=True)
    options = Options()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1300,1500"):
        options.add_argument(arg)
    options.binary_location = os.environ.get("SAS_CHROMIUM", "/usr/bin/chromium")
    driver = webdriver.Chrome(options=options, service=Service(os.environ.get("SAS_CHROMEDRIVER", "/usr/bin/chromedriver")))
    wait = WebDriverWait(driver, 60)
    taken = []

    def shot(name):
        path = os.path.join(shots, f"{len(taken) + 1}-{name}.png")
        driver.save_screenshot(path)
        taken.append(path)
        print(f"console-browser: screenshot {path}", flush=True)

    try:
        # The URL with its token: the cookie it sets lets the later pages in.
        driver.get(url)
        wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "nav.tabs")))
        driver.get(base + "/tasks?state=waiting")
        # The live refresh brings the order in once it waits (no reload).
        link = wait.until(ec.element_to_be_clickable((By.LINK_TEXT, order)))
        shot("tasks-waiting")
        link.click()
        graph = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "svg.graph")))
        steps = [g.get_attribute("data-step") for g in graph.find_elements(By.CSS_SELECTOR, "g.step")]
        assert "approve" in steps and "ship" in steps, f"graph steps: {steps}"
        assert "current" in graph.find_element(By.CSS_SELECTOR, 'g.step[data-step="approve"]').get_attribute("class")
        driver.find_element(By.CSS_SELECTOR, "svg.gantt")
        assert "timeline_dropped" in driver.find_element(By.TAG_NAME, "main").text
        shot("task-waiting")
        # Complete the callback step from the page: the dry run first.
        assert driver.find_element(By.ID, "action").get_attribute("value") == "complete"
        assert driver.find_element(By.ID, "step").get_attribute("value") == "approve"
        driver.find_element(By.ID, "reason").send_keys("approved by phone (browser test)")
        driver.find_element(By.ID, "dry-run").click()
        result = wait.until(ec.presence_of_element_located((By.ID, "dry-run-result")))
        assert "would be completed by hand: Waiting -> Pending" in result.text, result.text
        shot("dry-run")
        driver.find_element(By.ID, "confirm").click()
        result = wait.until(ec.presence_of_element_located((By.ID, "act-result")))
        assert "completed by hand: Waiting -> Pending" in result.text, result.text
        shot("completed")
        driver.find_element(By.ID, "back").click()
        # The live refresh shows it going on to Processed.
        wait.until(
            lambda d: d.find_element(By.CSS_SELECTOR, "p.summary").get_attribute("data-state") == "Processed"
        )
        timeline = driver.find_element(By.CSS_SELECTOR, "pre.record").text
        assert "approved by phone (browser test)" in timeline, timeline
        shot("processed")
    except Exception:
        shot("failure")
        raise
    finally:
        driver.quit()
    blank = [p for p in taken if not png_varies(p)]
    if blank:
        sys.exit(f"console-browser: blank screenshot(s): {', '.join(blank)}")
    print(f"console-browser: ok, {len(taken)} screenshots in {shots}")


if __name__ == "__main__":
    main()
