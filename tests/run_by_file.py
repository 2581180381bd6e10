"""Run the test suite one file per pytest process, then print one closing line.

Why: pyserini's JVM uses SIGSEGV internally (safepoints, null checks) and relies on its own
signal handler. In one long pytest process, native libraries loaded by later tests (Ray's
core worker, torch, faiss) re-install fatal-signal handlers, and the JVM started by an
earlier test then dies with SIGSEGV (measured: exit 139 inside tests/test_lucene.py after
~370 tests, never when the file runs alone). One process per file keeps native state apart.

    .venv/bin/python tests/run_by_file.py [pytest args...]     (what `make test` runs)
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def main(args: list[str]) -> int:
    totals = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    failed_files = []
    started = time.perf_counter()
    for path in sorted(TESTS.glob("test_*.py")):
        result = subprocess.run([sys.executable, "-m", "pytest", "-q", str(path.relative_to(TESTS.parent)), *args],
                                cwd=TESTS.parent, capture_output=True, text=True)
        tail = result.stdout.strip().splitlines()[-1] if result.stdout.strip() else ""
        counts = {key: int(n) for n, key in re.findall(r"(\d+) (passed|failed|skipped|errors?)", tail)}
        for key, n in counts.items():
            totals["errors" if key.startswith("error") else key] += n
        print(f"{path.name}: {tail or 'no output'} (rc={result.returncode})", flush=True)
        if result.returncode not in (0, 5):  # 5: nothing collected (e.g. deselected by -m)
            failed_files.append(path.name)
            print(result.stdout[-20000:], result.stderr[-5000:], sep="\n", flush=True)
    print(f"files: {len(failed_files)} failing {failed_files if failed_files else ''}; "
          f"{time.perf_counter() - started:.0f}s")
    print(f"{totals['passed']} passed, {totals['failed'] + totals['errors']} failed, {totals['skipped']} skipped")
    return 1 if failed_files else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
