"""What the real test servers need on the machine besides Python packages, and how to install it.

A launcher names its server's prerequisites (``Launcher.needs``): Debian
packages (``DebianPackage``, installed by ``apt-get`` as root), jars fetched
with Maven (``MavenJars``), binaries built with Go (``GoBuild``) and Python
environments made with pip (``PythonEnvironment``), all into the cache dir
(``consensus_testkit.host.cache_dir``), and tools only a person can install
(``Tool``, e.g. Go itself). ``consensus servers install NAME``
installs what is missing (``install``); starting a server without its
prerequisites is one ``NotInstalledError`` naming that command.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from consensus_api.errors import ConfigurationError
from consensus_testkit.host import cache_dir, run_checked

#: Long enough for a first Maven fetch or Go build on a slow network (about 2 minutes on CI).
FETCH_TIMEOUT = 1800.0
Say = Callable[[str], None]


class NotInstalledError(ConfigurationError):
    """A test server's prerequisite is missing; the message names what to install and how."""


@dataclass(frozen=True, kw_only=True)
class DebianPackage:
    """A Debian package: ``packages`` are candidates, the first one apt knows is installed;
    ``present`` says whether what it provides is there."""

    what: str
    packages: tuple[str, ...]
    present: Callable[[], bool]

    def installed(self) -> bool:
        return self.present()

    def how(self) -> str:
        return f"Debian package {self.packages[-1]}"

    def requires(self) -> tuple[Prerequisite, ...]:
        return ()


@dataclass(frozen=True, kw_only=True)
class Tool:
    """A tool only a person installs (``find`` returns its path, or None); ``how`` says how."""

    what: str
    find: Callable[[], str | None]
    instructions: str

    def installed(self) -> bool:
        return self.find() is not None

    def how(self) -> str:
        return self.instructions

    def requires(self) -> tuple[Prerequisite, ...]:
        return ()


@dataclass(frozen=True, kw_only=True)
class MavenJars:
    """The runtime jars ``pom`` depends on, fetched with Maven into ``<cache>/<into>``, complete when
    its marker file holds the POM's SHA-256 (a changed POM fetches them again)."""

    what: str
    pom: Path
    into: str

    @property
    def directory(self) -> Path:
        return cache_dir() / self.into

    def installed(self) -> bool:
        marker = self.directory / ".complete"
        return marker.is_file() and marker.read_text().strip() == _sha256(self.pom)

    def how(self) -> str:
        return f"fetched with Maven into {self.directory}"

    def requires(self) -> tuple[Prerequisite, ...]:
        return (MAVEN,)

    def fetch(self, say: Say) -> None:
        say(f"fetching {self.what} into {self.directory} (first time: about a minute)")
        self.directory.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=self.directory.parent) as work:
            jars, log = Path(work) / "jars", Path(work) / "mvn.log"
            command = ["mvn", "-q", "-B", "-f", str(self.pom), "dependency:copy-dependencies"]
            command += [f"-DoutputDirectory={jars}", "-DincludeScope=runtime"]
            run_checked(command, log, "maven", timeout=FETCH_TIMEOUT)
            if not any(jars.glob("*.jar")):
                raise RuntimeError(f"maven fetched no jar for {self.pom}\n{log.read_text(errors='replace')}")
            (jars / ".complete").write_text(_sha256(self.pom))
            shutil.rmtree(self.directory, ignore_errors=True)
            jars.rename(self.directory)
        say(f"{self.what}: {len(list(self.directory.glob('*.jar')))} jars in {self.directory}")


@dataclass(frozen=True, kw_only=True)
class GoBuild:
    """Binaries built with Go from the Go module proxy into ``<cache>/<into>``: ``binaries`` pairs each
    name with its main package, every one at ``version``. ``instead`` names an environment variable
    that may point at a binary to use instead of the first one (then nothing needs building)."""

    what: str
    into: str
    version: str
    binaries: tuple[tuple[str, str], ...]
    instead: str | None = None

    @property
    def directory(self) -> Path:
        return cache_dir() / self.into

    def installed(self) -> bool:
        chosen = os.environ.get(self.instead) if self.instead else None
        paths = [Path(chosen)] if chosen else [self.directory / name for name, _ in self.binaries]
        return all(path.is_file() and os.access(path, os.X_OK) for path in paths)

    def how(self) -> str:
        built = f"built with Go into {self.directory}"
        return f"{built}, or ${self.instead} naming a binary" if self.instead else built

    def requires(self) -> tuple[Prerequisite, ...]:
        return (GO,)

    def fetch(self, say: Say) -> None:
        go = GO.find()
        if go is None:  # install() builds only once GO is found
            raise RuntimeError("Go is not installed")
        say(f"building {self.what} with Go into {self.directory} (first time: about 2 minutes)")
        gopath = cache_dir() / "go"
        gopath.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "GOPATH": str(gopath),
            "GOMODCACHE": str(gopath / "mod"),
            "GOCACHE": str(gopath / "build"),
            "GOFLAGS": "-modcacherw",
            "CGO_ENABLED": "0",
        }
        with tempfile.TemporaryDirectory(prefix="build-", dir=gopath) as work:
            build, log = Path(work), Path(work) / "go.log"
            packages = [f"{package}@v{self.version}" for _, package in self.binaries]

            def go_run(*args: str) -> None:
                run_checked([go, *args], log, f"go {args[0]}", timeout=FETCH_TIMEOUT, cwd=build, env=env)

            go_run("mod", "init", "build")
            go_run("get", *packages)
            for name, package in self.binaries:
                go_run("build", "-o", str(build / "bin" / name), package)
            shutil.rmtree(self.directory, ignore_errors=True)
            (build / "bin").rename(self.directory)
        say(f"{self.what} built ({self.directory})")


@dataclass(frozen=True, kw_only=True)
class PythonEnvironment:
    """A virtual environment of this Python in ``<cache>/<into>`` holding ``packages`` (pip
    requirements) and their dependencies only, complete when its marker file names exactly these
    (other packages make it again)."""

    what: str
    into: str
    packages: tuple[str, ...]

    @property
    def directory(self) -> Path:
        return cache_dir() / self.into

    @property
    def python(self) -> Path:
        """The environment's interpreter."""
        return self.directory / "bin" / "python"

    def installed(self) -> bool:
        marker = self.directory / ".complete"
        return self.python.is_file() and marker.is_file() and marker.read_text() == "\n".join(self.packages)

    def how(self) -> str:
        return f"a virtual environment made with pip in {self.directory}"

    def requires(self) -> tuple[Prerequisite, ...]:
        return ()

    def fetch(self, say: Say) -> None:
        say(f"making {self.what} in {self.directory}: pip install {' '.join(self.packages)}")
        shutil.rmtree(self.directory, ignore_errors=True)
        self.directory.mkdir(parents=True)
        log = self.directory / "pip.log"
        run_checked([sys.executable, "-m", "venv", str(self.directory)], log, "python -m venv")
        install = [str(self.python), "-m", "pip", "install", "--disable-pip-version-check", *self.packages]
        run_checked(install, log, "pip install", timeout=FETCH_TIMEOUT)
        (self.directory / ".complete").write_text("\n".join(self.packages))
        say(f"{self.what}: {self.python}")


Prerequisite = DebianPackage | Tool | MavenJars | GoBuild | PythonEnvironment


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@functools.cache
def java_major() -> int:
    """The major version of ``java`` on PATH; 0 when there is none."""
    java = shutil.which("java")
    if java is None:
        return 0
    shown = subprocess.run(
        [java, "-XshowSettings:properties", "-version"], capture_output=True, text=True, check=False
    )
    found = re.search(r"java\.specification\.version = (\d+)", shown.stderr)
    return int(found.group(1)) if found else 0


def _go() -> str | None:
    found = shutil.which("go")
    return found or ("/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").is_file() else None)


JAVA = DebianPackage(
    what="a Java 17+ runtime",
    packages=("openjdk-17-jre-headless", "default-jre-headless"),
    present=lambda: java_major() >= 17,
)
MAVEN = DebianPackage(what="Maven", packages=("maven",), present=lambda: shutil.which("mvn") is not None)
GO = Tool(
    what="Go 1.21 or newer",
    find=_go,
    instructions="install Go 1.21 or newer (https://go.dev/dl): `go` on PATH or in /usr/local/go/bin",
)


def with_requirements(needs: Iterable[Prerequisite]) -> list[Prerequisite]:
    """``needs`` and, before each one that is missing, what installs it (e.g. Maven), each once."""
    ordered: list[Prerequisite] = []
    for need in needs:
        before = [] if need.installed() else with_requirements(need.requires())
        for each in (*before, need):
            if each not in ordered:
                ordered.append(each)
    return ordered


def check(server: str, needs: Iterable[Prerequisite]) -> None:
    """``NotInstalledError`` naming the first of ``needs`` that is missing for ``server`` and the
    command that installs it."""
    for need in needs:
        if not need.installed():
            raise NotInstalledError(
                f"{server} needs {need.what} ({need.how()}): run `consensus servers install {server}`"
            )


def install(needs: Iterable[Prerequisite], *, run_apt: bool, say: Say) -> list[str]:
    """Install what of ``needs`` (and their requirements) is missing; return what is still missing,
    one line each: what to run or do.

    Debian packages are installed with one ``apt-get`` run when ``run_apt`` (as root), else the
    ``apt-get`` line is returned; jars, binaries and Python environments are fetched, built or made
    in the cache dir once what fetches them is there. RuntimeError when a fetch or build fails.
    """
    ordered = with_requirements(needs)
    debian = [need for need in ordered if isinstance(need, DebianPackage) and not need.installed()]
    left: list[str] = []
    if debian:
        line = _apt_line(debian)
        if run_apt:
            say(f"{line} (missing: {', '.join(need.what for need in debian)})")
            _apt_get(line)
            java_major.cache_clear()
        else:
            left.append(f"as root: apt-get update && {line} (or this command with --yes, as root)")
    for need in ordered:
        if need.installed():
            say(f"{need.what}: ok")
        elif isinstance(need, MavenJars | GoBuild | PythonEnvironment) and all(
            each.installed() for each in need.requires()
        ):
            need.fetch(say)
        elif isinstance(need, Tool):
            left.append(need.how())
        elif not isinstance(need, DebianPackage):
            left.append(f"{need.what}: once {', '.join(each.what for each in need.requires())} is installed")
    return left


def _apt_line(debian: Iterable[DebianPackage]) -> str:
    """``apt-get install ...`` with, for each package, the first candidate apt knows."""
    names = [next((name for name in need.packages if _apt_knows(name)), need.packages[-1]) for need in debian]
    return f"apt-get install -y --no-install-recommends {' '.join(dict.fromkeys(names))}"


def _apt_knows(package: str) -> bool:
    if shutil.which("apt-cache") is None:
        return False
    shown = subprocess.run(["apt-cache", "show", package], capture_output=True, check=False)
    return shown.returncode == 0 and bool(shown.stdout.strip())


def _apt_get(line: str) -> None:
    if os.geteuid() != 0:
        raise NotInstalledError(f"installing Debian packages needs root: apt-get update && {line}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with tempfile.TemporaryDirectory(prefix="consensus-apt-") as work:
        log = Path(work) / "apt.log"
        run_checked(["apt-get", "update", "-qq"], log, "apt-get update", timeout=FETCH_TIMEOUT, env=env)
        run_checked([*line.split(), "-qq"], log, "apt-get install", timeout=FETCH_TIMEOUT, env=env)
