"""Which Python packages the pipeline needs on the GPU machine beyond what its image has, and whether a folder of
wheels covers them. Used by ``scripts/gpu_wheels.sh`` and ``scripts/gpu_check.sh``; stdlib + ``packaging`` only.

  python scripts/gpu_wheels.py plan             # name==version per line: what to carry (versions: this venv's)
  python scripts/gpu_wheels.py check .whl       # the wheels' own metadata: every requirement met? exit 1 if not
  python scripts/gpu_wheels.py verify-installed .whl   # on the GPU machine, after installing them
  python scripts/gpu_wheels.py simulate DIR     # DIR/env/bin/python: imports only what the GPU machine will have

The plan walks the requirements of the project's runtime dependencies (``pyproject.toml``) through the installed
distributions' metadata, with markers evaluated for the GPU machine (CPython 3.12, Linux x86_64), and stops at a
package the image has (``gpu_image_packages.txt``). Two substitutions, both because the pipeline logs to a local
SQLite store and never serves: ``mlflow`` becomes ``mlflow-skinny`` (the same Python code without the UI server's
dependencies: Flask, gunicorn, graphene, huey, skops, docker, …) plus the SQLite store's own needs (SQLAlchemy,
alembic), and the requirements in ``NOT_CARRIED`` are left out, each with its reason. The CPU dry run of
``gpu_check.sh --pipeline`` runs on the simulated view, so a pipeline path that imports a package left out fails here.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
IMAGE_LIST = ROOT / "scripts" / "gpu_image_packages.txt"
TARGET_PYTHON = (3, 12)
TARGET_PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
                    "manylinux2014_x86_64", "manylinux1_x86_64", "linux_x86_64"]
SUBSTITUTE = {"mlflow": ["mlflow-skinny", "sqlalchemy", "alembic"]}
# Required by mlflow-skinny's metadata, imported only on paths the pipeline never takes (the simulated view proves
# it: databricks-sdk, fastapi and starlette were on this list until `import mlflow` failed without them).
NOT_CARRIED = {
    "uvicorn": "MLflow's tracking server (the pipeline logs to a SQLite file, it serves nothing)",
}
# Carried although the image has them: a requirement of a carried wheel needs a newer version than the image is
# known to have (version unknown there; small, pure Python, backward compatible).
CARRY_ANYWAY = {"typing-extensions": "pydantic 2.14 needs ≥ 4.16; the image's version is not on record"}


def target_env() -> dict[str, str]:
    env = default_environment()
    env.update(python_version="3.12", python_full_version="3.12.3", implementation_name="cpython",
               platform_python_implementation="CPython", sys_platform="linux", platform_system="Linux",
               platform_machine="x86_64", os_name="posix", implementation_version="3.12.3")
    return env


def image_packages(path: Path = IMAGE_LIST) -> dict[str, Version | None]:
    """name -> version (None where not on record) of what the GPU image already has."""
    out: dict[str, Version | None] = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, *ver = line.split()
            out[canonicalize_name(name)] = Version(ver[0]) if ver else None
    return out


def runtime_requirements() -> list[Requirement]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return [Requirement(d) for d in deps]


def _applies(req: Requirement, env: dict[str, str]) -> bool:
    return req.marker is None or req.marker.evaluate({**env, "extra": ""})


def plan() -> dict[str, str]:
    """canonical name -> version to carry, walking this environment's installed metadata."""
    env, image = target_env(), image_packages()
    todo = [Requirement(s) for r in runtime_requirements()
            for s in SUBSTITUTE.get(canonicalize_name(r.name), [str(r)])]
    todo += [Requirement(n) for n in CARRY_ANYWAY]
    carry: dict[str, str] = {}
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if not _applies(req, env) or name in carry or name in NOT_CARRIED:
            continue
        if name in image and name not in CARRY_ANYWAY:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"error: {name} (needed on the GPU machine: {req}) is not installed in this environment, "
                             "whose versions the plan uses; run `make install` first") from None
        carry[name] = dist.version
        todo += [Requirement(r) for r in dist.requires or []]
    return dict(sorted(carry.items()))


def _wheel_metadata(path: Path) -> tuple[str, Version, list[Requirement]]:
    with zipfile.ZipFile(path) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA") and n.count("/") == 1)
        text = z.read(meta).decode()
    head = text.split("\n\n", 1)[0]
    fields = [line.split(": ", 1) for line in head.splitlines() if ": " in line]
    name = next(v for k, v in fields if k == "Name")
    version = Version(next(v for k, v in fields if k == "Version"))
    return canonicalize_name(name), version, [Requirement(v) for k, v in fields if k == "Requires-Dist"]


def check(folder: Path) -> list[str]:
    """Problems with ``folder``'s wheels for the GPU machine: a tag it cannot install, two versions of one package,
    a requirement (of a wheel or of the project) that neither a wheel nor the image meets. Empty: all met."""
    env, image = target_env(), image_packages()
    ok_tags = set(cpython_tags(TARGET_PYTHON, platforms=TARGET_PLATFORMS)) | set(
        compatible_tags(TARGET_PYTHON, "cp312", TARGET_PLATFORMS))
    problems, have, reqs = [], {}, []
    for whl in sorted(folder.glob("*.whl")):
        name, version, requires = _wheel_metadata(whl)
        if not set(parse_wheel_filename(whl.name)[3]) & ok_tags:
            problems.append(f"{whl.name}: no tag CPython 3.12 on manylinux x86_64 can install")
        if name in have:
            problems.append(f"{name}: two versions ({have[name]} and {version}); pip installs neither")
        have[name] = version
        reqs += [(f"{name} {version}", r) for r in requires]
    reqs += [("the project", Requirement(s)) for r in runtime_requirements()
             for s in SUBSTITUTE.get(canonicalize_name(r.name), [str(r)])]
    for who, req in reqs:
        name = canonicalize_name(req.name)
        if not _applies(req, env) or name in NOT_CARRIED:
            continue
        if name in have:
            if not req.specifier.contains(have[name], prereleases=True):
                problems.append(f"{who} needs {req}; the wheel is {have[name]}")
        elif name in image:
            known = image[name]
            if known is not None and not req.specifier.contains(known, prereleases=True):
                problems.append(f"{who} needs {req}; the image has {known}: carry a wheel of it")
        else:
            problems.append(f"{who} needs {req}: neither a wheel here nor in the image")
    return problems


def verify_installed(folder: Path) -> list[str]:
    """On the machine the wheels were installed on: each carried wheel's requirements against the versions this
    Python finds (the image's and the carried ones together); the image's versions are mostly not on record, so
    this is where a too-old one shows. Empty: all met."""
    env, problems = target_env(), []
    for whl in sorted(folder.glob("*.whl")):
        name, version, requires = _wheel_metadata(whl)
        for req in requires:
            if not _applies(req, env) or canonicalize_name(req.name) in NOT_CARRIED:
                continue
            try:
                found = Version(metadata.version(req.name))
            except metadata.PackageNotFoundError:
                problems.append(f"{name} {version} needs {req}: not installed")
                continue
            if not req.specifier.contains(found, prereleases=True):
                problems.append(f"{name} {version} needs {req}; this Python has {found}")
    return problems


def simulate(folder: Path) -> Path:
    """A Python that can import what the GPU machine will have and nothing else, on this machine: a venv without
    site-packages of its own whose one ``.pth`` line adds ``folder/site``, a folder of links to the top-level
    modules and dist-info of every distribution here that is carried or in the image (this machine's versions).
    Returns its interpreter; child processes started with it see the same view."""
    available = set(plan()) | set(image_packages())
    site = folder / "site"
    site.mkdir(parents=True, exist_ok=True)
    for dist in metadata.distributions():
        if canonicalize_name(dist.metadata["Name"]) not in available:
            continue
        for top in {str(f).split("/")[0] for f in dist.files or []} - {"..", "__pycache__"}:
            link = site / top
            if not link.exists():
                link.symlink_to(dist.locate_file(top))
    env = folder / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    (next((env / "lib").glob("python3*")) / "site-packages" / "gpu_view.pth").write_text(f"{site}\n")
    return env / "bin" / "python"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("plan", help="print name==version for every package to carry")
    c = sub.add_parser("check", help="check a folder of wheels against the image list and the project")
    c.add_argument("folder", type=Path, help="the folder of .whl files")
    i = sub.add_parser("verify-installed", help="on the GPU machine: the wheels' requirements against what is there")
    i.add_argument("folder", type=Path, help="the folder of .whl files that was installed")
    v = sub.add_parser("simulate", help="make DIR/env: a Python that imports only what the GPU machine will have")
    v.add_argument("folder", type=Path, help="an empty folder for the view and its venv")
    args = p.parse_args(argv)
    if args.cmd == "plan":
        print("\n".join(f"{n}=={v}" for n, v in plan().items()))
    elif args.cmd == "check":
        problems = check(args.folder)
        for line in problems:
            print(f"problem: {line}", file=sys.stderr)
        n = len(list(args.folder.glob("*.whl")))
        print(f"{n} wheels in {args.folder}: " + (f"{len(problems)} problems" if problems else
                                                 "every requirement met by a wheel or by the image"))
        return 1 if problems else 0
    elif args.cmd == "verify-installed":
        problems = verify_installed(args.folder)
        for line in problems:
            print(f"problem: {line}")
        print("requirements of the carried wheels: " + (f"{len(problems)} unmet (above)" if problems else
                                                        "all met by this machine's versions"))
        return 1 if problems else 0
    else:
        print(simulate(args.folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
