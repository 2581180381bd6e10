"""What `coevo demo` prints on this machine from a fresh clone: the quote the README trims and docs/experiments/demo_output.md gives in full, regenerated.

    .venv/bin/python bench/demo_quote.py [--onednn-max-cpu-isa AVX2] [--out FILE] [--columns 100]
        [--set KEY=VALUE ...] [--keep]

It clones HEAD (committed code only, what a user's clone holds) into a scratch folder, runs
`coevo demo` there with this project's .venv (the clone's code first on PYTHONPATH, nothing
cached), and samples the resident memory of every process of the demo's tree twice a second.
`--onednn-max-cpu-isa AVX2` caps oneDNN at AVX2: on a CPU with native bf16 this runs the
kernels (and, with `runtime.precision: auto`, the fp32 training) of a machine without it.

The quote (default `docs/demo_<precision>_<isa>.txt`) starts with a header: date, CPU model and
cores, the numerics every phase stamp recorded, wall time and each process's peak resident
memory; then the demo's terminal output at `--columns`. Last line on stdout:
`demo_wall_s=<s> peak_rss_gb=<GB of the largest process> numerics=<precision>/<isa>`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE_S = 0.5


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def label(proc) -> str:
    """A short name for a process of the demo's tree (what a user would recognise in `top`)."""
    try:
        cmd = proc.cmdline()
    except Exception:  # gone meanwhile
        return "?"
    text = " ".join(Path(cmd[0]).name if i == 0 else part for i, part in enumerate(cmd[:6]))
    return " ".join(text.split())[:90]  # one line, even for a `python -c` script


class PeakMemory:
    """Samples the resident memory of a process and its descendants; keeps each one's peak, and
    the root process's peak per step of the demo (``transcript``: the steps it reported done so far)."""

    def __init__(self, pid: int, transcript: Path) -> None:
        import psutil

        self.root = psutil.Process(pid)
        self.transcript = transcript
        self.peaks: dict[int, tuple[int, str]] = {}
        self.by_step: dict[int, int] = {}  # steps reported done before the sample -> the root's peak
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            finished = done_steps(self.transcript.read_text(errors="replace")) if self.transcript.exists() else []
            for proc in procs:
                try:
                    rss = proc.memory_info().rss
                except psutil.Error:
                    continue
                peak, name = self.peaks.get(proc.pid, (0, ""))
                if rss > peak:
                    self.peaks[proc.pid] = (rss, name or label(proc))
                if proc.pid == self.root.pid:
                    self.by_step[len(finished)] = max(rss, self.by_step.get(len(finished), 0))
            self._stop.wait(SAMPLE_S)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def top(self, n: int = 5) -> list[tuple[float, str]]:
        """The ``n`` largest peaks, in GB, with the process each was seen in."""
        return sorted(((rss / 1e9, name) for rss, name in self.peaks.values()), reverse=True)[:n]

    def steps(self, labels: list[str]) -> list[tuple[str, float]]:
        """(step, the demo process's peak GB while it ran): a sample taken after ``i`` done-lines
        belongs to the ``i+1``-th step; after the last one, to the final report."""
        named = [*labels, "tables, registry, DVC record"]
        return [(named[i], rss / 1e9) for i, rss in sorted(self.by_step.items()) if i < len(named)]


def done_steps(transcript: str) -> list[str]:
    """The labels of the steps the demo's screen reported done (``  SFT: done in 279.6s``), in order."""
    return [line.split(": done in ")[0].strip() for line in transcript.splitlines() if ": done in " in line]


def stamp_numerics(project: Path) -> list[tuple[str, dict]]:
    """(phase, numerics) of every phase stamp the demo wrote, in phase order."""
    out = []
    for stamp in sorted(project.glob("data/models/cogr/*/stamps/*.json")):
        numerics = json.loads(stamp.read_text()).get("numerics")
        if isinstance(numerics, dict):
            out.append((stamp.stem, numerics))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--onednn-max-cpu-isa", default="", help="cap oneDNN's ISA (AVX2: a CPU without bf16)")
    parser.add_argument("--out", type=Path, help="the quote file (default docs/demo_<precision>_<isa>.txt)")
    parser.add_argument("--columns", type=int, default=100, help="terminal width the demo renders for")
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="extra `coevo demo --set`")
    parser.add_argument("--keep", action="store_true", help="keep the scratch clone (its path is printed)")
    args = parser.parse_args()
    if not (REPO / ".venv" / "bin" / "coevo").exists():
        sys.exit(f"{REPO / '.venv'}: no coevo install; run `make install` first")
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.strip()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                            check=True).stdout.strip()
    if dirty:
        print(f"demo_quote: the work tree has uncommitted changes; the quote is of HEAD {commit}", file=sys.stderr)

    scratch = Path(tempfile.mkdtemp(prefix="coevo-demo-quote-"))
    project = scratch / "coevo"
    subprocess.run(["git", "clone", "-q", str(REPO), str(project)], check=True)
    (project / ".venv").symlink_to(REPO / ".venv")
    env = {key: value for key, value in os.environ.items() if key not in ("ONEDNN_MAX_CPU_ISA", "COEVO_THREADS")}
    env.update({"PYTHONPATH": str(project), "COLUMNS": str(args.columns), "TERM": "dumb", "NO_COLOR": "1",
                "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PREFECT_HOME": str(scratch / "prefect-home")})
    if args.onednn_max_cpu_isa:
        env["ONEDNN_MAX_CPU_ISA"] = args.onednn_max_cpu_isa
    command = [str(REPO / ".venv" / "bin" / "coevo"), "demo", *[f"--set={o}" for o in args.overrides]]
    print(f"demo_quote: {' '.join(command[1:])} in {project}" +
          (f" (ONEDNN_MAX_CPU_ISA={args.onednn_max_cpu_isa})" if args.onednn_max_cpu_isa else ""), flush=True)
    started = time.monotonic()
    with open(scratch / "demo.out", "w") as out:
        proc = subprocess.Popen(command, cwd=project, env=env, stdout=out, stderr=subprocess.STDOUT)
        with PeakMemory(proc.pid, scratch / "demo.out") as memory:
            rc = proc.wait()
    wall = time.monotonic() - started
    # rich pads table lines to the terminal width: trailing blanks are noise in a quote
    transcript = "".join(line.rstrip() + "\n" for line in (scratch / "demo.out").read_text().splitlines())
    if rc != 0:
        sys.exit(f"coevo demo exited {rc} after {wall:.0f}s; its output ended:\n" + "\n".join(transcript.splitlines()[-20:]))

    from coevo.runtime import describe_numerics

    stamps = stamp_numerics(project)
    if not stamps:
        sys.exit(f"{project}: the demo wrote no phase stamp with numerics")
    kinds = sorted({describe_numerics(n) for _, n in stamps})
    first = stamps[0][1]
    units = first.get("bf16_units", "") if first.get("precision") == "bf16" else ""  # AMX and AVX512_BF16 differ
    tag = f"{first.get('precision', '?')}_{first.get('cpu_isa', '?')}" + (f"_{units}" if units else "") + \
          (f"_cap{args.onednn_max_cpu_isa}" if args.onednn_max_cpu_isa else "")
    dest = args.out or REPO / "docs" / f"demo_{tag.lower()}.txt"
    peaks = memory.top()
    header = [
        f"# `coevo demo` from a fresh clone of {commit}, regenerated by: python bench/demo_quote.py"
        + (f" --onednn-max-cpu-isa {args.onednn_max_cpu_isa}" if args.onednn_max_cpu_isa else ""),
        f"# measured {datetime.date.today().isoformat()} on {cpu_model()}, {os.cpu_count()} cores"
        f"{', ONEDNN_MAX_CPU_ISA=' + args.onednn_max_cpu_isa if args.onednn_max_cpu_isa else ''}",
        f"# numerics of every phase: {'; '.join(kinds)}",
        f"# wall {wall:.0f}s; peak resident memory per process: "
        + "; ".join(f"{gb:.2f} GB {name}" for gb, name in peaks),
        "# the demo process's peak per step: "
        + "; ".join(f"{step} {gb:.2f} GB" for step, gb in memory.steps(done_steps(transcript))),
        "",
    ]
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text("\n".join(header) + transcript)
    print("\n".join(header[1:5]))
    print(f"quote: {dest}")
    if args.keep:
        print(f"scratch clone kept: {project}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    isa = first.get("cpu_isa", "?") + (f"-cap{args.onednn_max_cpu_isa}" if args.onednn_max_cpu_isa else "")
    print(f"demo_wall_s={wall:.1f} peak_rss_gb={peaks[0][0]:.2f} numerics={first.get('precision', '?')}/{isa}")


if __name__ == "__main__":
    main()
