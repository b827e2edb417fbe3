"""`make install`'s apt step waits while another apt holds its lock (.ci/apt-install): `apt-get update`
is retried while, and only while, the lock is what failed, up to APT_LOCK_WAIT_S; `apt-get install`
waits through dpkg's own `DPkg::Lock::Timeout`. Against a stand-in `apt-get` on PATH that logs its
arguments and fails as apt does; the real apt-get is never run here."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / ".ci" / "apt-install"

FAKE_APT = """#!/usr/bin/env bash
echo "$*" >> "{log}"
if [[ " $* " == *" update "* ]]; then
  n=$(( $(cat "{count}" 2>/dev/null || echo 0) + 1 )); echo "$n" > "{count}"
  if (( n <= {lock_failures} )); then
    echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 4242 (apt-get)" >&2; exit 100
  fi
  {update_fails}
fi
exit 0
"""


def fake_apt(tmp_path: Path, lock_failures: int, update_fails: str = "") -> tuple[dict[str, str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    script = FAKE_APT.format(log=log, count=tmp_path / "count", lock_failures=lock_failures, update_fails=update_fails)
    (bin_dir / "apt-get").write_text(script)
    (bin_dir / "apt-get").chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, log


def install(env: dict[str, str], wait_s: int) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    done = subprocess.run(
        [str(SCRIPT), "chromium", "fonts-wqy-microhei"],
        env={**env, "APT_LOCK_WAIT_S": str(wait_s)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, time.monotonic() - started


def test_a_held_lock_is_waited_for_then_both_steps_run(tmp_path: Path) -> None:
    env, log = fake_apt(tmp_path, lock_failures=2)
    done, _ = install(env, wait_s=30)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    assert calls == [
        "-o DPkg::Lock::Timeout=30 update -q",
        "-o DPkg::Lock::Timeout=30 update -q",
        "-o DPkg::Lock::Timeout=30 update -q",
        "-o DPkg::Lock::Timeout=30 install -y -q chromium fonts-wqy-microhei",
    ]


def test_another_failure_of_update_is_not_retried(tmp_path: Path) -> None:
    env, log = fake_apt(tmp_path, lock_failures=0, update_fails='echo "E: Failed to fetch http://deb" >&2; exit 100')
    done, seconds = install(env, wait_s=30)
    assert done.returncode == 1 and "Failed to fetch" in done.stderr
    assert len(log.read_text().splitlines()) == 1 and seconds < 5  # no install, no waiting


def test_a_lock_held_past_the_wait_fails_with_apts_message(tmp_path: Path) -> None:
    env, log = fake_apt(tmp_path, lock_failures=10_000)
    done, seconds = install(env, wait_s=2)
    assert done.returncode == 1 and "Could not get lock" in done.stderr
    assert 2 <= seconds < 10
    assert "install" not in log.read_text()


def test_make_install_uses_it() -> None:
    dry = subprocess.run(["make", "-n", "install"], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True)
    assert "APT_LOCK_WAIT_S=600 .ci/apt-install chromium fonts-wqy-microhei" in dry.stdout
