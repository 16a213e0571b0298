"""Instructions per request on the gateway's request path: `make bench-instructions`.

Runs ``bench.inprocess`` (the real gateway, transports in memory) under valgrind's
callgrind twice, with ``--requests`` and three times as many, and reports the difference
divided by the extra requests: start-up and warm-up cancel out, and the count is the same from
run to run (within about 2%: the garbage collector runs at slightly different moments), where
CPU time on this shared machine moves by ±25%. Use it to tell whether a change to the hot path
helped; ``make bench-proxy`` remains the measure of the goals (it includes the kernel's share).

``--against REF`` measures a git revision as well, in a temporary worktree, and prints the
ratio (the harness of this checkout is used for both; ``--ref-harness`` keeps the revision's
own, for a revision from before a move of the modules the harness imports). The compiled build
(``make compiled``, ``build/compiled``) gets its own row when it is there, and then the
revision is compiled too and compared compiled against compiled.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_COLLECTED = re.compile(r"Collected : (\d+)")


# where the in-process harness is: here, then where older checkouts keep it
HARNESSES = (
    Path("bench/inprocess.py"),
    Path("loadtest/bench/inprocess.py"),
    Path("loadtest/inprocess.py"),
)


def harness_module(checkout: Path) -> str:
    """The in-process harness's module name in ``checkout``."""
    path = next((p for p in HARNESSES if (checkout / p).exists()), HARNESSES[-1])
    return ".".join(path.with_suffix("").parts)


def instructions(checkout: Path, peer: str, requests: int, feature: str | None = None) -> int:
    """Instructions that ``requests`` requests add to a run of the in-process harness (the two
    runs side by side, one per core)."""
    # a fixed hash seed: str hashes (dict probes) the same from run to run, so the count is too
    env = dict(os.environ, PYTHONPATH=str(checkout), PYTHONHASHSEED="0")
    module = harness_module(checkout)
    runs = [
        subprocess.Popen(
            [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                sys.executable,
                "-m",
                module,
                "--requests",
                str(total),
                "--peer",
                peer,
                *(["--feature", feature] if feature else []),
            ],
            cwd=checkout,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for total in (requests, 3 * requests)
    ]
    counts = []
    for run in runs:
        _, stderr = run.communicate()
        found = _COLLECTED.search(stderr)
        if run.returncode != 0 or found is None:
            raise RuntimeError(f"valgrind run failed in {checkout}:\n{stderr[-2000:]}")
        counts.append(int(found.group(1)))
    return (counts[1] - counts[0]) // (2 * requests)


def worktree(ref: str, directory: Path, own_harness: bool) -> Path:
    """``ref`` checked out under ``directory``, with this checkout's harness unless
    ``own_harness``."""
    path = directory / "ref"
    subprocess.run(
        ["git", "worktree", "add", "--detach", str(path), ref],
        cwd=ROOT,
        check=True,
        capture_output=True,
    )
    if not own_harness:  # this tree's harness, with the mock upstream it imports
        (path / "bench").mkdir(exist_ok=True)
        for name in ("__init__.py", "inprocess.py", "mock_upstream.py"):
            shutil.copy(ROOT / "bench" / name, path / "bench" / name)
    return path


def compile_in_place(path: Path) -> None:
    """The mypyc build of the checkout at ``path``, next to its sources."""
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
        cwd=path,
        env=dict(os.environ, KVGATE_COMPILE="1"),
        check=True,
        capture_output=True,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--against", metavar="REF", help="also measure this git revision")
    parser.add_argument(
        "--ref-harness", action="store_true", help="run REF with its own bench.inprocess"
    )
    parser.add_argument(
        "--features",
        type=lambda text: [f for f in text.split(",") if f],
        default=[],
        metavar="A,B",
        help="also this checkout with each of these parts in use (bench.inprocess.FEATURES)",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is required (make bench-instructions installs it)", file=sys.stderr)
        return 2
    checkouts = [("this checkout", ROOT)]
    compiled = ROOT / "build" / "compiled"
    if (compiled / ".stamp").exists():
        checkouts.append(("this checkout, compiled", compiled))
    scratch = Path(tempfile.mkdtemp(prefix="kvgate-instructions-"))
    try:
        if args.against:
            ref = worktree(args.against, scratch, args.ref_harness)
            checkouts.insert(0, (args.against, ref))
            if len(checkouts) == 3:  # this checkout's compiled build is there: compile REF too
                shutil.copytree(ref, scratch / "ref-compiled", symlinks=True)
                compile_in_place(scratch / "ref-compiled")
                checkouts.insert(1, (f"{args.against}, compiled", scratch / "ref-compiled"))
        results: dict[str, dict[str, int]] = {}
        print("| checkout | kvgate instructions/request | http layers only | gateway's own |")
        print("|---|---:|---:|---:|")
        for name, path in checkouts:
            counts = {
                peer: instructions(path, peer, args.requests) for peer in ("kvgate", "layers")
            }
            results[name] = counts
            own = counts["kvgate"] - counts["layers"]
            print(f"| {name} | {counts['kvgate']:,} | {counts['layers']:,} | {own:,} |")
        ours = [c for c in checkouts if c[1] in (ROOT, compiled)]
        _feature_rows(args.features, ours, results, args.requests)
        if args.against:
            before, after = results[args.against]["kvgate"], results["this checkout"]["kvgate"]
            print(f"\nthis checkout ÷ {args.against}: {after / before:.3f}")
            if f"{args.against}, compiled" in results:
                before = results[f"{args.against}, compiled"]["kvgate"]
                after = results["this checkout, compiled"]["kvgate"]
                print(f"compiled ÷ {args.against} compiled: {after / before:.3f}")
    finally:
        if args.against:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(scratch / "ref")],
                cwd=ROOT,
                capture_output=True,
            )
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def _feature_rows(
    features: list[str],
    checkouts: list[tuple[str, Path]],
    plain: dict[str, dict[str, int]],
    requests: int,
) -> None:
    """One row per part in use and build: its instructions per request and the ratio to the
    same build without it."""
    if not features:
        return
    print("\n| part in use | build | kvgate instructions/request | ÷ without it |")
    print("|---|---|---:|---:|")
    for feature in features:
        for name, path in checkouts:
            count = instructions(path, "kvgate", requests, feature)
            ratio = count / plain[name]["kvgate"]
            print(f"| {feature} | {name} | {count:,} | {ratio:.3f} |")


if __name__ == "__main__":
    raise SystemExit(main())
