#!/usr/bin/env python3
"""Create one isolated virtual environment per third-party PPO library under .envs/NAME.

Each environment is built with ``python3 -m venv`` and pip only (never uv or poetry: they do
not look at the CPU torch wheel on local disk and would download a multi-GB CUDA build), in
this order:

1. ``torch==2.13.0`` first (the CPU wheel on local disk; an unpinned torch pulls CUDA builds);
2. the library and what its PPO modules import, with exact pins (the recipes: tools/env_recipes.py);
3. ppo-ref itself, editable and without dependencies (``pip install --no-deps -e .``), then what
   ppo-ref needs at test time (numpy, pytest, hypothesis);
4. a check, in the environment's own interpreter, that torch is still the 2.13.0 CPU build and
   that the modules an adapter uses import.

Every pip call is given a constraints file (.envs/constraints.txt, ``torch==2.13.0``), also
exported as PIP_CONSTRAINT so that pip subprocesses see it, so nothing can replace torch: a
package that insists on another torch makes pip fail instead.

An environment that exists, was built from the same recipe and passes its check is skipped
(``--recreate`` rebuilds it). One that was built from the same recipe but fails its check is
repaired in place (the pip steps are re-run; already-satisfied pins cost nothing), unless its
torch is not the 2.13.0 CPU build: then, like one built from another recipe or left half-built,
it is deleted and rebuilt.

Use an environment with its own interpreter, e.g. ``.envs/verl/bin/python -m pytest ...``;
TRL needs ``TRL_EXPERIMENTAL_SILENCE=1`` in the environment (see ``Recipe.env``).
Per-environment logs: .envs/logs/NAME.log; state and timings: .envs/NAME/ppo-ref-env.json;
full package list: .envs/NAME/freeze.txt. docs/thirdparty-envs.md records pins, times, sizes
and the signatures of the functions the adapters call.

Exit status: 0 when every requested environment is ready, 1 otherwise (each failure names its
environment), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import fcntl
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
ENVS_DIR = REPO / ".envs"
LOG_DIR = ENVS_DIR / "logs"
CONSTRAINTS = ENVS_DIR / "constraints.txt"
STATE_FILE = "ppo-ref-env.json"

JSON = dict[str, Any]

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # run as a script, the checkout's root is not on the path

from tools.env_recipes import (  # noqa: E402
    PROJECT_EXTRAS,
    PYTHON_MAJOR_MINOR,
    RECIPES,
    TEST_PINS,
    TORCH_EXPECTED_VERSION,
    TORCH_PIN,
    TORCH_WHEEL_GLOBS,
    Recipe,
    constraints_text,
)

# ---------------------------------------------------------------------------------------------
# helpers


def _fmt_secs(s: float) -> str:
    return f"{s:6.1f}s" if s < 120 else f"{s / 60:5.1f}min"


def _du(path: Path) -> int:
    """Disk usage in bytes, as ``du -sk`` counts it (what ``du -sh`` prints)."""
    try:
        out = subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True)
        return int(out.stdout.split()[0]) * 1024
    except (OSError, subprocess.CalledProcessError, ValueError, IndexError):
        total = 0
        for root, _dirs, files in os.walk(path):
            for f in files:
                try:
                    total += os.lstat(os.path.join(root, f)).st_blocks * 512
                except OSError:
                    pass
        return total


def _human(n: int) -> str:
    for unit in ("B", "K", "M", "G"):
        if n < 1024 or unit == "G":
            return f"{n:.0f}{unit}" if unit in ("B", "K") else f"{n:.1f}{unit}"
        n /= 1024  # type: ignore[assignment]
    return str(n)


class EnvFailure(Exception):
    pass


class Builder:
    def __init__(self, recipe: Recipe, python: str, verbose: bool, with_project: bool) -> None:
        self.r = recipe
        self.python = python
        self.verbose = verbose
        self.with_project = with_project
        self.dir = ENVS_DIR / recipe.name
        self.py = self.dir / "bin" / "python"
        self.log = LOG_DIR / f"{recipe.name}.log"
        self.step_times: dict[str, float] = {}

    # -- output -------------------------------------------------------------------------------
    def say(self, msg: str) -> None:
        print(f"[{self.r.name}] {msg}", flush=True)

    def _subenv(self) -> dict[str, str]:
        env = dict(os.environ)
        for var in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "CONDA_PREFIX", "PIP_REQUIRE_VIRTUALENV"):
            env.pop(var, None)
        env["PYTHONNOUSERSITE"] = "1"
        env["PIP_CONSTRAINT"] = str(CONSTRAINTS)
        env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
        env["VIRTUAL_ENV"] = str(self.dir)
        env["PATH"] = f"{self.dir / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env.update(dict(self.r.env))
        return env

    def run(self, label: str, cmd: list[str], *, cwd: Path | None = None) -> None:
        t0 = time.monotonic()
        with self.log.open("a") as log:
            log.write(f"\n$ {' '.join(cmd)}\n")
            log.flush()
            if self.verbose:
                proc = subprocess.Popen(
                    cmd,
                    cwd=cwd or REPO,
                    env=self._subenv(),
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                assert proc.stdout is not None
                for line in proc.stdout:
                    log.write(line)
                    sys.stdout.write(f"    {line}")
                rc = proc.wait()
            else:
                rc = subprocess.call(
                    cmd, cwd=cwd or REPO, env=self._subenv(), stdout=log, stderr=subprocess.STDOUT
                )
        dt = time.monotonic() - t0
        self.step_times[label] = self.step_times.get(label, 0.0) + dt
        self.say(f"{'ok ' if rc == 0 else 'FAILED'} {_fmt_secs(dt)}  {label}")
        if rc != 0:
            tail = self.log.read_text(errors="replace").splitlines()[-25:]
            raise EnvFailure(
                f"step '{label}' exited {rc}; last lines of {self.log}:\n"
                + textwrap.indent("\n".join(tail), "    ")
            )

    def pip(self, label: str, *args: str) -> None:
        self.run(label, [str(self.py), "-m", "pip", "install", "-c", str(CONSTRAINTS), *args])

    # -- state --------------------------------------------------------------------------------
    def state(self) -> JSON | None:
        try:
            state = json.loads((self.dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) else None

    def write_state(self, check: JSON, seconds: float) -> None:
        state = {
            "name": self.r.name,
            "recipe_digest": self.r.digest(),
            "steps": [list(s) for s in self.r.steps],
            "torch": check.get("torch"),
            "install_seconds": round(seconds, 1),
            "step_seconds": {k: round(v, 1) for k, v in self.step_times.items()},
            "size_bytes": _du(self.dir),
            "versions": check.get("versions"),
            "imports": check.get("imports"),
            "probe_imports": check.get("probe_imports"),
            "project": check.get("project"),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        (self.dir / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

    # -- check --------------------------------------------------------------------------------
    def check(self) -> JSON:
        """Run the check inside the env; return its report (raises EnvFailure if it cannot run)."""
        project = project_info()
        probe = {
            "expected_torch": TORCH_EXPECTED_VERSION,
            "imports": list(self.r.imports),
            "probe_imports": list(self.r.probe_imports),
            "report": [*self.r.report, *(name for name in TEST_PINS if name not in self.r.report)],
            "project": project,
            "prelude": self.r.check_prelude,
        }
        code = CHECK_SCRIPT.replace("@@PROBE@@", json.dumps(probe))
        proc = subprocess.run(
            [str(self.py), "-c", code],
            cwd="/",
            env=self._subenv(),
            capture_output=True,
            text=True,
            timeout=600,
        )
        with self.log.open("a") as log:
            log.write(f"\n$ check\n{proc.stderr[-4000:]}\n{proc.stdout}\n")
        try:
            out: JSON = json.loads(proc.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError) as exc:
            raise EnvFailure(
                f"check could not run (exit {proc.returncode}):\n"
                + textwrap.indent(proc.stderr[-2000:], "    ")
            ) from exc
        return out

    @staticmethod
    def problems(check: JSON, with_project: bool) -> list[str]:
        bad = []
        t = check.get("torch") or {}
        if not torch_ok(check):
            bad.append(
                f"torch was replaced: found {t.get('version')!r} (cuda={t.get('cuda')!r}) at "
                f"{t.get('file')}, expected {TORCH_EXPECTED_VERSION!r} (CPU build)"
            )
        for mod, res in (check.get("imports") or {}).items():
            if res != "ok":
                bad.append(f"import {mod} failed: {res}")
        versions = check.get("versions") or {}
        for name, pin in TEST_PINS.items():
            if with_project and versions.get(name) != pin:
                bad.append(f"{name} {versions.get(name)}, expected {pin} (TEST_PINS)")
        proj = check.get("project") or {}
        if with_project and proj.get("expected") and not proj.get("ok"):
            bad.append(f"ppo-ref project not installed editable from {REPO}: {proj.get('detail')}")
        return bad

    # -- build --------------------------------------------------------------------------------
    def ensure(self, recreate: bool, check_only: bool) -> JSON:
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        t_start = time.monotonic()
        state = self.state()
        exists = self.py.exists()

        if exists and not recreate:
            same_recipe = state is not None and state.get("recipe_digest") == self.r.digest()
            if same_recipe:
                check = self.check()
                bad = self.problems(check, self.with_project)
                if not bad:
                    self.say("up to date, check passed; skipped (use --recreate to rebuild)")
                    return {"status": "skipped", "check": check, "state": state}
                if check_only:
                    raise EnvFailure("check failed:\n  " + "\n  ".join(bad))
                if not torch_ok(check):
                    # Whatever replaced torch may have changed other packages too: start over.
                    self.say("check failed, recreating:\n  " + "\n  ".join(bad))
                    recreate = True
                else:
                    self.say("check failed, repairing in place:\n  " + "\n  ".join(bad))
                    return self._build(t_start, fresh=False)
            elif check_only:
                raise EnvFailure("environment was built from another recipe or not finished")
            else:
                self.say("built from another recipe or left half-built: recreating")
                recreate = True
        elif check_only:
            raise EnvFailure(f"environment {self.dir} does not exist")

        if recreate and self.dir.exists():
            t0 = time.monotonic()
            shutil.rmtree(self.dir)
            self.say(f"deleted the old environment ({_fmt_secs(time.monotonic() - t0).strip()})")
        # The recorded install time counts from here: it leaves out deleting an old env.
        return self._build(time.monotonic(), fresh=True)

    def _build(self, t_start: float, fresh: bool) -> JSON:
        if fresh:
            self.log.write_text(f"# {self.r.name}: build started {time.ctime()}\n")
            self.run("venv", [self.python, "-m", "venv", str(self.dir)])
        # 1. torch first, from the wheel on disk when it is there.
        wheel = find_torch_wheel()
        if wheel is None:
            self.say(
                "WARNING: no torch-2.13.0+cpu wheel found in "
                f"{', '.join(TORCH_WHEEL_GLOBS)}; asking pip for {TORCH_PIN} (may be a CUDA build)"
            )
        self.pip("torch", str(wheel) if wheel else TORCH_PIN)
        # 2. the library, exactly pinned.
        for i, step in enumerate(self.r.steps, 1):
            self.pip(f"step {i}: {' '.join(step)}", *step)
        # 3. ppo-ref itself, editable without deps, then what it needs.
        project_error = None
        if self.with_project:
            if project_installable():
                self.pip("ppo-ref editable (--no-deps)", "--no-deps", "-e", str(REPO))
            else:
                project_error = (
                    f"cannot install ppo-ref: neither {REPO / 'pyproject.toml'} nor "
                    f"{REPO / 'setup.py'} exists (rerun once the project has one, or pass "
                    "--no-project)"
                )
                self.say(f"ERROR: {project_error}")
            pinned = [f"{name}=={TEST_PINS[name]}" if name in TEST_PINS else name for name in PROJECT_EXTRAS]
            self.pip("ppo-ref needs: " + " ".join(pinned), *pinned)
        # 4. record and check.
        with (self.dir / "freeze.txt").open("w") as fh:
            subprocess.run(
                [str(self.py), "-m", "pip", "freeze", "--all"],
                env=self._subenv(),
                stdout=fh,
                stderr=subprocess.DEVNULL,
                check=False,
            )
        pip_check = subprocess.run(
            [str(self.py), "-m", "pip", "check"], env=self._subenv(), capture_output=True, text=True
        )
        (self.dir / "pip-check.txt").write_text(pip_check.stdout + pip_check.stderr)
        t0 = time.monotonic()
        check = self.check()
        self.step_times["check"] = time.monotonic() - t0
        bad = self.problems(check, self.with_project)
        if project_error:
            bad.append(project_error)
        seconds = time.monotonic() - t_start
        if bad:
            raise EnvFailure("check failed after install:\n  " + "\n  ".join(bad))
        self.write_state(check, seconds)
        self.say(f"check passed ({_fmt_secs(self.step_times['check']).strip()})")
        return {"status": "built" if fresh else "repaired", "check": check, "state": self.state()}


CHECK_SCRIPT = r"""
import importlib, importlib.metadata as md, json, os, sys, traceback
probe = json.loads(r'''@@PROBE@@''')
out = {"python": sys.version.split()[0], "imports": {}, "probe_imports": {}, "versions": {}}
try:
    import torch
    out["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda, "file": torch.__file__}
except Exception as exc:
    out["torch"] = {"version": None, "cuda": None, "file": repr(exc)}
if probe.get("prelude"):
    try:
        exec(probe["prelude"], {})
        out["prelude"] = "ok"
    except BaseException as exc:
        out["prelude"] = f"{type(exc).__name__}: {exc}"[:400]
for key in ("imports", "probe_imports"):
    for mod in probe[key]:
        try:
            importlib.import_module(mod)
            out[key][mod] = "ok"
        except BaseException as exc:
            out[key][mod] = f"{type(exc).__name__}: {exc}"[:400]
for dist in probe["report"]:
    try:
        out["versions"][dist] = md.version(dist)
    except md.PackageNotFoundError:
        out["versions"][dist] = None
proj = probe["project"]
info = {"expected": bool(proj["name"]), "ok": False, "detail": ""}
if proj["name"]:
    try:
        d = md.distribution(proj["name"])
        info["version"] = d.version
        direct = json.loads(d.read_text("direct_url.json") or "{}")
        editable = direct.get("dir_info", {}).get("editable", False)
        url = direct.get("url", "")
        info["ok"] = bool(editable) and url.rstrip("/").endswith(proj["root"].rstrip("/"))
        info["detail"] = f"editable={editable} url={url}"
        for module in (proj.get("modules") or []) if info["ok"] else []:
            try:
                m = importlib.import_module(module)
                info.setdefault("module_files", {})[module] = getattr(m, "__file__", None)
            except BaseException as exc:
                info["ok"] = False
                info["detail"] += f"; import {module} failed: {type(exc).__name__}: {exc}"
    except md.PackageNotFoundError:
        info["detail"] = f"distribution {proj['name']!r} not installed"
out["project"] = info
print(json.dumps(out))
"""


def torch_ok(check: JSON) -> bool:
    """True when the env's torch is the 2.13.0 CPU build (as reported by the check)."""
    t = check.get("torch") or {}
    return t.get("version") == TORCH_EXPECTED_VERSION and t.get("cuda") is None


def project_installable() -> bool:
    return (REPO / "pyproject.toml").exists() or (REPO / "setup.py").exists()


def project_info() -> JSON:
    """Name and import package of ppo-ref, read from its pyproject.toml (if it has one yet)."""
    name = None
    pyproject = REPO / "pyproject.toml"
    if pyproject.exists():
        text = pyproject.read_text()
        try:
            import tomllib  # type: ignore[import-not-found, unused-ignore]  # Python >= 3.11

            name = tomllib.loads(text).get("project", {}).get("name")
        except ImportError:  # Python 3.10: read [project] name by hand
            section = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
            pattern = r"""^name\s*=\s*["']([^"']+)["']"""
            found = section and re.search(pattern, section.group(1), re.M)
            name = found.group(1) if found else None
        except ValueError:
            name = None
    if name is None and (REPO / "setup.py").exists():
        name = "ppo-ref"
    # The packages the editable install must map: an environment installed before the suite became
    # the package ppo_ref_conformance (pytest11 entry point) lacks it and is repaired by reinstalling.
    packages = (("ppo_ref", "ppo_ref/__init__.py"), ("ppo_ref_conformance", "conformance/plugin.py"))
    modules = [module for module, marker in packages if (REPO / marker).exists()]
    return {"name": name, "root": REPO.as_uri(), "modules": modules}


def find_torch_wheel() -> Path | None:
    for pattern in TORCH_WHEEL_GLOBS:
        hits = sorted(glob.glob(pattern))
        if hits:
            return Path(hits[-1])
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python tools/thirdparty_envs.py",
        description=__doc__.split("\n\n")[0]
        + "\n\n"
        + "\n".join(f"  {r.name:9s} {r.summary}" for r in RECIPES.values()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Details: docs/thirdparty-envs.md. Logs: .envs/logs/NAME.log.",
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"environments to build (default: all of {', '.join(RECIPES)})",
    )
    parser.add_argument(
        "--recreate",
        action="store_true",
        help="delete and rebuild the environments even if they pass their check",
    )
    parser.add_argument(
        "--check", action="store_true", help="only check the existing environments; build nothing"
    )
    parser.add_argument(
        "--no-project", action="store_true", help="do not install ppo-ref itself into the environments"
    )
    parser.add_argument(
        "--python",
        default="python3",
        help="interpreter that creates the venvs (default: python3; must be 3.11)",
    )
    parser.add_argument("--list", action="store_true", help="print the recipes and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="stream pip's output")
    args = parser.parse_args(argv)

    unknown = [n for n in args.names if n not in RECIPES]
    if unknown:
        parser.error(f"unknown environment(s) {', '.join(unknown)}; known: {', '.join(RECIPES)}")
    names = args.names or list(RECIPES)

    if args.list:
        for n in names:
            r = RECIPES[n]
            print(f"{n}: {r.summary}")
            print(f"  pip install {TORCH_PIN}")
            for s in r.steps:
                print(f"  pip install {' '.join(s)}")
            pins = (f"{name}=={TEST_PINS[name]}" if name in TEST_PINS else name for name in PROJECT_EXTRAS)
            print(f"  pip install --no-deps -e .; pip install {' '.join(pins)}")
            print(f"  check imports: {', '.join(r.imports)}")
            if r.probe_imports:
                print(f"  probe imports: {', '.join(r.probe_imports)}")
            for k, v in r.env:
                print(f"  env: {k}={v}")
        return 0

    if not args.check:
        try:
            ver = subprocess.run(
                [args.python, "-c", "import sys; print('%d %d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.split()
        except (OSError, subprocess.CalledProcessError) as exc:
            print(f"error: cannot run {args.python}: {exc}", file=sys.stderr)
            return 2
        if tuple(map(int, ver)) != PYTHON_MAJOR_MINOR:
            print(
                f"error: {args.python} is Python {'.'.join(ver)}; the torch CPU wheel needs "
                f"{'.'.join(map(str, PYTHON_MAJOR_MINOR))}",
                file=sys.stderr,
            )
            return 2

    if not args.no_project and not args.check and not project_installable():
        print(
            f"error: ppo-ref cannot be installed into the environments: neither "
            f"{REPO / 'pyproject.toml'} nor {REPO / 'setup.py'} exists yet. Rerun once the "
            "project has one, or pass --no-project to build the environments without it.",
            file=sys.stderr,
        )
        return 2

    ENVS_DIR.mkdir(exist_ok=True)
    lock_fh = (ENVS_DIR / ".lock").open("w")
    try:
        fcntl.flock(lock_fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(f"error: another thirdparty_envs.py run holds {ENVS_DIR / '.lock'}", file=sys.stderr)
        return 2
    if not CONSTRAINTS.exists() or CONSTRAINTS.read_text() != constraints_text():
        CONSTRAINTS.write_text(constraints_text())

    results: dict[str, tuple[str, float, str]] = {}
    failed: list[str] = []
    for n in names:
        b = Builder(RECIPES[n], args.python, args.verbose, with_project=not args.no_project)
        t0 = time.monotonic()
        try:
            res = b.ensure(recreate=args.recreate, check_only=args.check)
            status = res["status"]
            probes = (res.get("check") or {}).get("probe_imports") or {}
            for mod, r in probes.items():
                if r != "ok":
                    b.say(f"note: {mod} does not import here ({r.splitlines()[0][:160]})")
        except EnvFailure as exc:
            status = "FAILED"
            failed.append(n)
            print(f"[{n}] ERROR in environment '{n}' ({b.dir}): {exc}", file=sys.stderr, flush=True)
        except KeyboardInterrupt:
            print(f"[{n}] interrupted; the half-built env will be rebuilt next time", file=sys.stderr)
            return 1
        dt = time.monotonic() - t0
        size = _human(_du(b.dir)) if b.dir.exists() else "-"
        results[n] = (status, dt, size)
        b.say(f"{status} in {_fmt_secs(dt).strip()}, size {size}")

    print("\nenvironment  status     time      size")
    for n, (status, dt, size) in results.items():
        print(f"{n:12s} {status:9s} {_fmt_secs(dt):>9s} {size:>7s}")
    if failed:
        print(f"\nFAILED: {', '.join(failed)} (logs in {LOG_DIR})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
