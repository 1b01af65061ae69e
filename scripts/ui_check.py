"""Open the two pages a user reads — `dvc plots show`'s page and the MLflow UI's runs table — in headless Chromium
and check they render what the docs say; optionally save screenshots of both (docs/mlflow-runs.png, docs/plots.png).

Run: .venv/bin/python scripts/ui_check.py [--root .] [--screenshots docs/]
Needs Chromium (Debian: `apt-get install chromium`). The plots page is opened with every network request sent to
a dead proxy, so it must draw from its inlined scripts alone. Exit 1 with the problems found.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import click
import yaml

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
OFFLINE = "--proxy-server=127.0.0.1:9"  # every request goes to a closed port: nothing loads from the network


def browser() -> str | None:
    """The Chromium executable on PATH, or None."""
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


class Page:
    """One headless Chromium tab driven through the DevTools protocol over a pipe (``--remote-debugging-pipe``:
    JSON messages ending in NUL on file descriptors 3 and 4; no websocket library needed)."""

    def __init__(self, size: tuple[int, int] = (1600, 1100), offline: bool = False):
        exe = browser()
        if exe is None:
            raise RuntimeError(f"no Chromium found ({', '.join(BROWSERS)})")
        self._profile = tempfile.TemporaryDirectory()
        to_browser, self._out = os.pipe()
        self._in, from_browser = os.pipe()

        def fds() -> None:  # in the child: its fd 3 reads our commands, its fd 4 carries the answers
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)

        self._proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--remote-debugging-pipe",
             f"--user-data-dir={self._profile.name}", f"--window-size={size[0]},{size[1]}",
             *([OFFLINE] if offline else []), "about:blank"],
            preexec_fn=fds, pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser)
        os.close(from_browser)
        self._buffer, self._id, self.session = b"", 0, None
        target = self.send("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.send("Emulation.setDeviceMetricsOverride", width=size[0], height=size[1], deviceScaleFactor=1,
                  mobile=False)

    def send(self, method: str, **params):
        """Send one command and return its result (events in between are dropped)."""
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if self.session and not method.startswith("Target."):
            message["sessionId"] = self.session
        os.write(self._out, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self._buffer:
                chunk = os.read(self._in, 1 << 16)
                if not chunk:
                    raise RuntimeError("Chromium closed the DevTools pipe")
                self._buffer += chunk
            raw, self._buffer = self._buffer.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})

    def js(self, expression: str):
        """The value of a JavaScript expression in the page (awaited when it is a promise)."""
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result.get("result", {}).get("value")

    def open(self, url: str, ready: str = "document.readyState === 'complete'", timeout: float = 60) -> bool:
        """Load ``url``, then wait until the JavaScript condition ``ready`` holds; False on timeout."""
        self.send("Page.navigate", url=url)
        return self.wait(ready, timeout)

    def wait(self, condition: str, timeout: float = 60) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.js(f"Boolean({condition})"):
                return True
            time.sleep(0.25)
        return False

    def click(self, element: str) -> bool:
        """Click, with real mouse events, the element the JavaScript expression ``element`` finds (menus of
        React component libraries open on pointer events, not on ``element.click()``); False when there is none."""
        if not self.js(f"(() => {{ const e = {element}; if (e) e.scrollIntoView({{block: 'center'}}); "
                       "return !!e; })()"):
            return False
        time.sleep(0.3)  # a scrolled (virtualised) list redraws: find the element again where it now is
        where = self.js(f"(() => {{ const e = {element}; if (!e) return null; "
                        "const b = e.getBoundingClientRect(); return [b.x + b.width / 2, b.y + b.height / 2]; })()")
        if not where:
            return False
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=where[0], y=where[1], button="left", clickCount=1)
        return True

    def type(self, text: str) -> None:
        self.send("Input.insertText", text=text)

    def key(self, key: str, code: int) -> None:
        for kind in ("keyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", type=kind, key=key, code=key, windowsVirtualKeyCode=code)

    def screenshot(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self.send("Page.captureScreenshot", format="png")["data"]))

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self.send("Browser.close")
        try:
            self._proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        for fd in (self._in, self._out):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._profile.cleanup()

    def __enter__(self) -> Page:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_plots_page(root: Path, screenshot: Path | None = None) -> list[str]:
    """`dvc plots show` into a temporary folder, opened with the network cut off: no <script src> at all, and a
    chart drawn by vega (a canvas of marks) in the panel of each plot dvc.yaml declares — and in no other panel."""
    problems = []
    wanted = sorted(name for plot in yaml.safe_load((root / "dvc.yaml").read_text())["plots"] for name in plot)
    with tempfile.TemporaryDirectory() as out:
        done = subprocess.run([sys.executable, "-m", "dvc", "plots", "show", "-o", out], cwd=root, check=True,
                              capture_output=True, text=True)
        # DVC draws an empty panel, and only warns, when it cannot read a plot's rows (a field missing in some).
        problems += [f"dvc plots show: {line.strip()}" for line in (done.stdout + done.stderr).splitlines()
                     if line.startswith(("WARNING", "ERROR"))]
        page_file = Path(out) / "index.html"
        if re.search(r"<script[^>]+src=", page_file.read_text()):
            problems.append("the plots page loads a script from elsewhere")
        with Page((1300, 1500), offline=True) as page:
            page.open(page_file.as_uri(), f"document.querySelectorAll('canvas.marks').length >= {len(wanted)}", 30)
            drawn = sorted(page.js("[...document.querySelectorAll('div[id]')]"
                                   ".filter(d => d.querySelector('canvas.marks')).map(d => d.id)") or [])
            if screenshot is not None:
                page.screenshot(screenshot)
    if drawn != wanted:
        problems.append(f"plots page: charts drawn for {drawn}, dvc.yaml declares {wanted}")
    return problems


# The runs table's columns docs/mlflow-and-dvc.md lists; added the way a user does it, through "Columns".
COLUMNS = ("test_acc", "d_acc_pp", "speed_x", "verdict")


def _leaf(text: str) -> str:
    """JavaScript: the open column menu's entry whose whole text is ``text`` (the search highlights the part that
    matches, so "bf16.test_accuracy" has a highlighted "test_acc" inside: its entry's text is longer)."""
    t = json.dumps(text)
    return (f"[...document.querySelectorAll('[role=menu] *, [role=dialog] *')].find(e => e.textContent.trim() === {t} "
            f"&& e.parentElement && e.parentElement.textContent.trim() === {t})")


def check_runs_table(root: Path, parents: list[str], children: list[str], screenshot: Path | None = None,
                     env: dict[str, str] | None = None) -> list[str]:
    """`ampbench ui --port 0` on the project's store (``env``: its environment, default this one's): the runs
    table lists the ``parents``; expanded, it shows their ``children``; the columns the docs list can be added
    (``COLUMNS``) and then head the table."""
    ui = subprocess.Popen([sys.executable, "-m", "ampbench.cli", "ui", "--root", str(root), "--port", "0"],
                          cwd=root, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          env={**(os.environ if env is None else env), "PYTHONUNBUFFERED": "1"})
    problems = []
    try:
        link = next((line.split()[2] for line in ui.stdout if line.startswith("MLflow UI:")), None)
        if link is None:
            return [f"ampbench ui printed no link (exit {ui.wait()})"]
        with Page((1800, 1000)) as page:
            text = "document.body.innerText"
            if not page.open(link, " && ".join(f"{text}.includes({json.dumps(n)})" for n in parents), 90):
                return [f"runs table: not all of {parents} listed within 90 s"]
            page.click("document.querySelector('button[data-component-id=\"mlflow.assistant.chat_panel.close\"]')")
            page.click("[...document.querySelectorAll('button')].find(b => b.innerText.trim() === 'Columns')")
            search = "document.querySelector('input[placeholder=\"Search columns\"]')"
            for column in COLUMNS:
                page.wait(search, 10)
                page.click(search)
                page.js(f"{search}.select()")
                page.type(column)
                if not (page.wait(_leaf(column), 10) and page.click(_leaf(column))):
                    problems.append(f"runs table: no column {column!r} to add")
                time.sleep(0.5)
            page.key("Escape", 27)
            # Each parent's "+" button (the run name cell's expander) shows the runs nested under it.
            page.js("document.querySelectorAll('button[data-component-id*=\"runnamecellrenderer\"]')"
                    ".forEach(b => b.click())")
            page.wait(" && ".join(f"{text}.includes({json.dumps(n)})" for n in children), 30)
            time.sleep(1)
            shown = page.js(text) or ""
            headers = page.js("[...document.querySelectorAll('[role=columnheader]')].map(h => h.innerText.trim())")
            if screenshot is not None:
                page.screenshot(screenshot)
    finally:
        ui.terminate()
        try:
            ui.wait(timeout=30)
        except subprocess.TimeoutExpired:
            ui.kill()
    problems += [f"runs table: no run named {name!r}" for name in [*parents, *children] if name not in shown]
    problems += [f"runs table: column {c!r} not shown" for c in COLUMNS if c not in (headers or [])]
    return problems


@click.command()
@click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True,
              help="Project whose plots and MLflow store to open (after `dvc repro`).")
@click.option("--screenshots", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Save plots.png and mlflow-runs.png into this folder.")
@click.option("--parent", "parents", multiple=True, required=True,
              help="A parent run the runs table must list (repeatable), e.g. repro@abc1234.")
@click.option("--child", "children", multiple=True, help="A run it must show nested under one (repeatable).")
def main(root: Path, screenshots: Path | None, parents: tuple[str, ...], children: tuple[str, ...]) -> None:
    """Render the plots page (offline) and the MLflow runs table in headless Chromium; exit 1 on problems."""
    root = root.resolve()
    problems = check_plots_page(root, screenshots / "plots.png" if screenshots else None)
    problems += check_runs_table(root, list(parents), list(children),
                                 screenshots / "mlflow-runs.png" if screenshots else None)
    for problem in problems:
        click.echo(f"problem: {problem}", err=True)
    click.echo("ok: plots page and runs table render" if not problems else f"{len(problems)} problem(s)")
    raise SystemExit(1 if problems else 0)


if __name__ == "__main__":
    main()
