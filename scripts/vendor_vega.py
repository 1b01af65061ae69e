"""Rebuild .dvc/plots/page.html: DVC's plots page with vega, vega-lite and vega-embed inlined, so `dvc plots show`
draws offline (DVC's own page loads them from a CDN and is blank without network).

Run: python scripts/vendor_vega.py   (needs npm and network to the npm registry; the tarballs are checked against
the sha256 sums below, so a rebuild gives the same bytes). Bump a version: change it here, run, and replace its sum
with the one printed.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / ".dvc" / "plots" / "page.html"
LICENSE = ROOT / ".dvc" / "plots" / "VEGA-LICENSE.txt"

# The major versions DVC's renderer targets (vega 5, vega-lite 5, vega-embed 6), at their latest releases.
PACKAGES = {
    "vega": ("5.33.1", "build/vega.min.js", "1b8504b6731c5311be3269c4d84ca996a5cc293bc772283293ede20c490e16c3"),
    "vega-lite": ("5.23.0", "build/vega-lite.min.js",
                  "e4cbfdd8f6f1abe381c59cd558fd6a559c12b1496bfdf2e0c3295263a40fe4da"),
    "vega-embed": ("6.29.0", "build/vega-embed.min.js",
                   "ecf1ee709c2bac9e0a4ead6908114b05b62c71493e10a8a4308109bb070f8eb1"),
}

# DVC fills {plot_divs} (and {refresh_tag} for `dvc plots show --open` with refresh); there is no {scripts}, so
# DVC's CDN <script> tags are never added.
TEMPLATE = """<!DOCTYPE html>
<html>
<head>
    {{refresh_tag}}
    <meta charset="utf-8">
    <title>ampbench: DVC plots</title>
    <!-- {versions}: BSD-3-Clause, Copyright (c) 2015, University of Washington Interactive Data Lab; licence text
         in .dvc/plots/VEGA-LICENSE.txt. Inlined by scripts/vendor_vega.py so the page works offline. -->
{scripts}
    <style>
        body {{ font-family: sans-serif; }}
        table {{ border-spacing: 15px; }}
    </style>
</head>
<body>
    {{plot_divs}}
</body>
</html>
"""


def fetch(name: str, version: str, member: str, sha256: str, folder: Path) -> tuple[str, str]:
    """(the build's JavaScript, the package's LICENSE text or '') from the npm tarball, checked against sha256."""
    subprocess.run(["npm", "pack", "--silent", f"{name}@{version}"], cwd=folder, check=True, capture_output=True)
    tarball = folder / f"{name}-{version}.tgz"
    digest = hashlib.sha256(tarball.read_bytes()).hexdigest()
    if digest != sha256:
        sys.exit(f"{tarball.name}: sha256 {digest}, expected {sha256}")
    with tarfile.open(tarball) as tar:
        js = tar.extractfile(f"package/{member}").read().decode()
        names = tar.getnames()
        license_text = tar.extractfile("package/LICENSE").read().decode() if "package/LICENSE" in names else ""
    if "</script" in js.lower():
        sys.exit(f"{name}: the build contains '</script' and cannot be inlined")
    return js, license_text


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        parts = {name: fetch(name, *spec, Path(tmp)) for name, spec in PACKAGES.items()}
    scripts = "\n".join(f'    <script type="text/javascript">/* {name} {PACKAGES[name][0]} */\n{js}\n    </script>'
                        for name, (js, _) in parts.items())
    versions = ", ".join(f"{name} {spec[0]}" for name, spec in PACKAGES.items())
    PAGE.write_text(TEMPLATE.format(versions=versions, scripts=scripts))
    license_text = next(text for _, text in parts.values() if text)
    LICENSE.write_text(f"{versions} (npm packages, license field BSD-3-Clause), inlined in page.html:\n\n"
                       f"{license_text}")
    print(f"wrote {PAGE.relative_to(ROOT)} ({PAGE.stat().st_size:,} bytes) and {LICENSE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
