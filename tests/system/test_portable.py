"""The checkout works wherever it is cloned: no tracked file names a path of one machine.

Three test modules once hard-coded another checkout's ``.venv``; CI stayed green only
because that checkout existed on the CI machine. This check keeps the mistake out.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Assembled from pieces so this file does not match itself.
_SLASH = "/"
MACHINE_PATH = re.compile(
    "|".join(
        [
            # a checkout or a home or temporary folder
            rf"(?<![\w.~-]){_SLASH}(?:work|home|root|Users|tmp|var{_SLASH}tmp|private{_SLASH}var)"
            rf"{_SLASH}[\w.-][\w./-]*",
            # a virtual environment or an installed package, at an absolute path
            rf"(?<![\w.~-]){_SLASH}[\w./-]*{_SLASH}(?:\.venv|site-packages){_SLASH}[\w./-]*",
            # a Windows profile
            r"[A-Za-z]:\\\\?Users\\",
        ]
    )
)


def tracked_text_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout
    paths = [ROOT / name for name in listed.decode().split("\0") if name]
    return [path for path in paths if path.is_file() and b"\0" not in path.read_bytes()[:8192]]


def machine_paths(text: str) -> list[str]:
    return [match.group(0) for match in MACHINE_PATH.finditer(text)]


def test_the_check_sees_machine_paths() -> None:
    venv = _SLASH.join(["", "work", "main", ".venv", "bin", "temporal"])
    home = _SLASH.join(["", "home", "ada", "src"])
    temp = _SLASH.join(["", "tmp", "chaos.md"])
    for text in (f'DEV_SERVER = "{venv}"', f"cd {home}", f"CHAOS_REPORT={temp}"):
        assert machine_paths(text), text
    for text in ("/etc/postgresql", "https://example.org/work/x", ".venv/bin/python", "a/tmp/b"):
        assert not machine_paths(text), text


def test_no_tracked_file_names_a_path_of_one_machine() -> None:
    files = tracked_text_files()
    assert len(files) > 50
    found = []
    for path in files:
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            found.extend(f"{path.relative_to(ROOT)}:{number}: {hit}" for hit in machine_paths(line))
    assert found == [], "absolute paths of one machine:\n" + "\n".join(found)
