"""Run every finding's standalone reproduction in its library's environment, as a maintainer would.

    python3 tools/run_findings_repros.py                 # every findings/repro/*.py (CI)
    python3 tools/run_findings_repros.py verl-f1 trl-*   # only these (shell-style patterns)
    python3 tools/run_findings_repros.py --list          # script, interpreter; runs nothing

A reproduction (``findings/repro/<finding-id>.py``, see its README) prints the expected and the
computed number and exits 1 while the behaviour its entry describes appears (the wrong number; for a
``latent`` entry, on the input the pipeline does not make; for a ``convention``, the library still
following it), 0 when it does not. Each is run with the
first ``.envs/NAME/bin/python`` its docstring names, from the repository root, through a wrapper that
checks, once the script has finished, that nothing of ppo-ref was imported: no module ``ppo_ref`` (every
environment has ppo-ref installed, so an accidental import would otherwise pass unnoticed) and no
module loaded from ``findings/repro/`` other than the script itself (a shared helper makes a script
that cannot be copied out alone).

Exit status: 0 when every script exited 1 (each finding still reproduces on the pinned release) and
imported nothing of ppo-ref; 1 otherwise, with a line per script saying what happened: ``reproduces``,
``no longer reproduces`` (exit 0: the release fixed it, or the script is wrong), ``imported ppo_ref``,
``imported a repro helper``, ``crashed (rc 2)`` (an uncaught exception, which would otherwise exit 1
like a reproduction).

Only the standard library is imported, so it runs under any Python 3.11.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REPRO = REPO / "findings" / "repro"
INTERPRETER = re.compile(r"\.envs/[a-z0-9_]+/bin/python")

CRASHED = 2
IMPORTED_PPO_REF = 3
IMPORTED_HELPER = 4

WRAPPER = f"""
import runpy, sys, traceback
from pathlib import Path
script = Path(sys.argv[1]).resolve()
sys.argv = [str(script)]
code = 0
try:
    runpy.run_path(str(script), run_name="__main__")
except SystemExit as exit:
    code = exit.code if isinstance(exit.code, int) else (0 if exit.code is None else 1)
except BaseException:  # Python would exit 1, the status of "reproduces"
    traceback.print_exc()
    code = {CRASHED}
names = [name for name in sys.modules if name == "ppo_ref" or name.startswith("ppo_ref.")]
if names:
    print(f"run_findings_repros: {{script.name}} imported {{names[:3]}}", file=sys.stderr)
    sys.exit({IMPORTED_PPO_REF})
helpers = sorted(
    name for name, module in list(sys.modules.items())
    if (getattr(module, "__file__", None) or "").startswith(str(script.parent) + "/")
    and Path(module.__file__).resolve() != script  # __main__, __mp_main__: the script itself
)
if helpers:
    print(f"run_findings_repros: {{script.name}} imported {{helpers}} from its folder", file=sys.stderr)
    sys.exit({IMPORTED_HELPER})
sys.exit(code)
"""


@dataclass(frozen=True)
class Outcome:
    script: str
    python: str
    rc: int
    seconds: float

    @property
    def verdict(self) -> str:
        """What the exit status says about the finding and the script."""
        return {
            1: "reproduces",
            0: "no longer reproduces",
            IMPORTED_PPO_REF: "imported ppo_ref",
            IMPORTED_HELPER: "imported a repro helper",
        }.get(self.rc, f"crashed (rc {self.rc})")

    @property
    def ok(self) -> bool:
        return self.rc == 1


def interpreter(script: Path) -> str:
    """The first ``.envs/NAME/bin/python`` the script names (its docstring). ValueError if none."""
    found = INTERPRETER.search(script.read_text(encoding="utf-8"))
    if found is None:
        raise ValueError(f"script: {script} names no .envs/NAME/bin/python interpreter")
    return found.group(0)


def scripts(patterns: list[str], folder: Path = REPRO) -> list[Path]:
    """The reproductions (``[a-z]*.py``, not the ``_``-prefixed helpers) whose stem matches one of
    ``patterns`` (all when empty). ValueError when a pattern matches none."""
    every = sorted(folder.glob("[a-z]*.py"))
    if not patterns:
        return every
    chosen = []
    for pattern in patterns:
        matched = [path for path in every if fnmatch.fnmatch(path.stem, pattern)]
        if not matched:
            raise ValueError(f"patterns: {pattern!r} matches no script in {folder}")
        chosen += [path for path in matched if path not in chosen]
    return chosen


def run(script: Path, root: Path = REPO) -> Outcome:
    """Run one reproduction through the wrapper; its output goes to this process's output."""
    python = interpreter(script)
    if not (root / python).exists():
        raise ValueError(
            f"script: {script.name} needs {python}, which is not built (tools/thirdparty_envs.py)"
        )
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1"}
    start = time.monotonic()
    rc = subprocess.run([str(root / python), "-c", WRAPPER, str(script)], cwd=root, env=env).returncode
    return Outcome(script.name, python, rc, time.monotonic() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("patterns", nargs="*", help="finding ids or shell patterns (default: all)")
    parser.add_argument("--list", action="store_true", help="list scripts and interpreters, run nothing")
    args = parser.parse_args(argv)
    try:
        chosen = scripts(args.patterns)
        if args.list:
            for script in chosen:
                print(f"{script.name}  {interpreter(script)}")
            return 0
        outcomes = []
        for script in chosen:
            print(f"-- {interpreter(script)} {script.relative_to(REPO)}", flush=True)
            outcomes.append(run(script))
    except ValueError as error:
        print(f"run_findings_repros: {error}", file=sys.stderr)
        return 2
    print("\nscript | interpreter | rc | seconds | verdict")
    for o in outcomes:
        print(f"{o.script} | {o.python} | {o.rc} | {o.seconds:.0f} | {o.verdict}")
    bad = [o for o in outcomes if not o.ok]
    print(
        f"{len(outcomes) - len(bad)} of {len(outcomes)} reproduce standalone"
        + (f"; not: {', '.join(o.script for o in bad)}" if bad else "")
    )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
