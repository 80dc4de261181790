"""The usage page in a real headless Chromium (Selenium, Debian's chromium
and chromium-driver), against a gateway the Rust test started and made
refuse a request.

    usage_page.py BASE_URL TENANT KEY ADMIN_TOKEN OUT_DIR BATCH_ID

Prints "ok" and exits 0 when every check passed; raises otherwise.
"""

import json
import os
import sys

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

base, tenant, key, admin, out_dir, batch = sys.argv[1:7]
os.makedirs(out_dir, exist_ok=True)

MARKUP = '<img src=x onerror="window.pwned=1"><b>evil</b>'

opts = Options()
opts.binary_location = os.environ.get("CHROMIUM", "/usr/bin/chromium")
for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--window-size=1280,2200"):
    opts.add_argument(arg)
driver = webdriver.Chrome(
    service=Service(os.environ.get("CHROMEDRIVER", "/usr/bin/chromedriver")), options=opts
)
wait = WebDriverWait(driver, 20)

# Tenant names are restricted to [a-z0-9_-] by the policy, so no real
# answer carries markup: once the test sets `inject`, a wrapper around
# fetch renames the tenant to markup, to prove the page renders it as text.
driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": """
  const realFetch = window.fetch.bind(window);
  window.fetch = async (...args) => {
    const resp = await realFetch(...args);
    if (!sessionStorage.getItem("inject")) return resp;
    const data = await resp.json();
    data.tenant = %s;
    return new Response(JSON.stringify(data), {status: resp.status, headers: resp.headers});
  };
""" % json.dumps(MARKUP)})


def sign_in(secret):
    driver.find_element(By.ID, "key").send_keys(secret)
    driver.find_element(By.CSS_SELECTOR, "#form button").click()


def text(selector):
    return driver.find_element(By.CSS_SELECTOR, selector).text


try:
    driver.get(base + "/fairway/")
    assert driver.find_element(By.ID, "signin").is_displayed()
    sign_in(key)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".tenant-name"))
    assert text(".tenant-name") == tenant, text(".tenant-name")

    # The key is in the tab's session storage only: not in the URL, not in
    # a cookie, not in the page.
    assert key not in driver.current_url
    assert driver.execute_script("return document.cookie") == ""
    assert driver.execute_script("return sessionStorage.getItem('fairway.key')") == key
    assert key not in driver.page_source

    # Attainment, and the refusal the test made, explained in words.
    tiles = [t.text for t in driver.find_elements(By.CSS_SELECTOR, ".tile")]
    attainment = [t for t in tiles if t.startswith("SLO attainment, last 5 min")]
    assert attainment and "%" in attainment[0], tiles
    sentences = [li.text for li in driver.find_elements(By.CSS_SELECTOR, "ul.sentences li")]
    assert any("You went over your request rate" in s for s in sentences), sentences
    assert len(driver.find_elements(By.CSS_SELECTOR, ".charts svg")) == 4
    # The tenant's batch, with its progress.
    row = driver.find_element(By.CSS_SELECTOR, f'table.batches tr[data-batch="{batch}"]')
    cells = [td.text for td in row.find_elements(By.TAG_NAME, "td")]
    assert cells[0] == batch and cells[2].endswith("of 1"), cells
    driver.save_screenshot(os.path.join(out_dir, "usage-page.png"))

    # On a phone: nothing wider than the screen.
    driver.set_window_size(390, 844)
    overflow = driver.execute_script(
        "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
    assert overflow <= 1, f"{overflow} px wider than a phone's screen"
    driver.save_screenshot(os.path.join(out_dir, "usage-page-phone.png"))
    driver.set_window_size(1280, 2200)

    # A name with markup shows as text and runs nothing.
    driver.execute_script("sessionStorage.setItem('inject', '1')")
    driver.refresh()
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, ".tenant-name"))
    name = driver.find_element(By.CSS_SELECTOR, ".tenant-name")
    assert name.get_attribute("textContent") == MARKUP, name.get_attribute("textContent")
    assert not driver.find_elements(By.CSS_SELECTOR, ".tenant img, .tenant b")
    assert driver.execute_script("return window.pwned === undefined")
    driver.execute_script("sessionStorage.removeItem('inject')")

    # The operator's view: every tenant, worst attainment first.
    driver.find_element(By.ID, "signout").click()
    assert driver.find_element(By.ID, "signin").is_displayed()
    assert driver.execute_script("return sessionStorage.getItem('fairway.key')") is None
    sign_in(admin)
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#tenants tbody tr"))
    rows = [[td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in driver.find_elements(By.CSS_SELECTOR, "#tenants tbody tr")]
    assert len(rows) >= 2 and tenant in [r[0] for r in rows], rows
    ranked = [float(r[1].rstrip(" %")) for r in rows if r[1].endswith("%")]
    assert ranked == sorted(ranked), rows
    driver.save_screenshot(os.path.join(out_dir, "usage-page-operator.png"))
    print("ok")
finally:
    driver.quit()
