"""The chat page at / in headless Chromium (Debian chromium + chromium-driver + selenium)."""
import shutil

import pytest


def test_page_streams_a_reply(base_url):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (apt python3-selenium)")
    if not (shutil.which("chromium") and shutil.which("chromedriver")):
        pytest.skip("headless Chromium not available (apt install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service  # present in every selenium 4.x
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    opts = webdriver.ChromeOptions()
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        opts.add_argument(a)
    service = Service(executable_path=shutil.which("chromedriver"))
    driver = webdriver.Chrome(options=opts, service=service)
    try:
        driver.get(base_url + "/")
        driver.find_element(By.ID, "input").send_keys("Hello")
        driver.find_element(By.ID, "send").click()
        done = WebDriverWait(driver, 300).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.assistant[data-done='1']"))
        assert not driver.find_elements(By.CSS_SELECTOR, ".msg.error")
        text = done[0].find_element(By.CSS_SELECTOR, ".content").text
        reasoning = done[0].find_element(By.CSS_SELECTOR, ".reasoning-text").get_attribute("textContent")
        assert text or reasoning  # something streamed in
    finally:
        driver.quit()
