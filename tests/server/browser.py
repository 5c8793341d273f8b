"""A real browser for the dashboard's tests: Debian's Chromium (scripts/host-deps.sh installs
it), driven by Playwright's Python package with `executable_path`, never a downloaded build.
The flags keep it off the network (this machine has none but loopback) and its profile is a
fresh directory, removed afterwards. Every console error and uncaught page error is kept, so a
test can assert there were none; screenshots go to `artifacts_dir()`, outside the repo."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from playwright.sync_api import ConsoleMessage, Error, Page, Response, ViewportSize, sync_playwright

from tests.leftovers import owned_tmpdir

CHROMIUM = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]
DESKTOP: ViewportSize = {"width": 1280, "height": 800}
PHONE: ViewportSize = {"width": 390, "height": 844}


def artifacts_dir() -> Path:
    """Where screenshots go: $PANDASTACK_ARTIFACTS/dashboard, else /tmp/pandastack-artifacts/
    dashboard; printed, so a run's log says where to look."""
    root = Path(os.environ.get("PANDASTACK_ARTIFACTS", "/tmp/pandastack-artifacts"))
    path = root / "dashboard"
    path.mkdir(parents=True, exist_ok=True)
    print(f"dashboard screenshots: {path}")
    return path


def list_responses(page: Page) -> list[Response]:
    """The page's lists of sandboxes (GET .../v1/sandboxes, through the dashboard's proxy)
    from now on, in order of arrival."""
    seen: list[Response] = []

    def on_response(response: Response) -> None:
        request = response.request
        if request.method == "GET" and urlsplit(response.url).path.endswith("/v1/sandboxes"):
            seen.append(response)

    page.on("response", on_response)
    return seen


@dataclass
class Browser:
    page: Page
    errors: list[str] = field(default_factory=list)

    def shot(self, name: str) -> Path:
        path = artifacts_dir() / f"{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path

    def sign_in(self, base_url: str, key: str) -> None:
        self.page.goto(f"{base_url}/dashboard/")
        self.page.wait_for_url("**/dashboard/login")
        self.page.fill("#key", key)
        self.page.keyboard.press("Enter")  # keyboard only: the form submits on Enter
        self.page.wait_for_url("**/dashboard/#/sandboxes")
        self.page.wait_for_selector("#who:not(:empty)")


@contextmanager
def chromium(viewport: ViewportSize | None = None,
             resolve_to_loopback: str | None = None) -> Iterator[Browser]:
    """A fresh Chromium with one page; confirm/prompt dialogs are accepted (with their
    default text). `resolve_to_loopback`: a host name pattern (`*.preview.example.com`)
    whose names Chromium resolves to 127.0.0.1, with no DNS."""
    args = FLAGS if resolve_to_loopback is None else [
        *FLAGS, f"--host-resolver-rules=MAP {resolve_to_loopback} 127.0.0.1"]
    profile = owned_tmpdir("ps-chromium-")
    try:
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                str(profile), executable_path=CHROMIUM, headless=True, args=args,
                viewport=viewport or DESKTOP)
            try:
                page = context.pages[0] if context.pages else context.new_page()
                browser = Browser(page)

                def console(message: ConsoleMessage) -> None:
                    if message.type == "error":
                        browser.errors.append(f"console: {message.text} ({message.location})")

                def page_error(error: Error) -> None:
                    browser.errors.append(f"page error: {error}")

                page.on("console", console)
                page.on("pageerror", page_error)
                page.on("dialog", lambda dialog: dialog.accept(dialog.default_value))
                yield browser
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert not profile.exists()


@contextmanager
def signed_in_chromium(base_url: str, key: str) -> Iterator[Browser]:
    """A Chromium signed in to the dashboard at `base_url` with `key`; its pages must have
    logged no error by the end."""
    with chromium() as browser:
        browser.sign_in(base_url, key)
        yield browser
        assert not browser.errors, browser.errors
