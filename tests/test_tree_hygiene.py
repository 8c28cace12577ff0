"""Nothing in the tree points outside it: no link or path to a folder beside the
repository, no internal issue numbers or planning labels, no path of a development machine.
A user of the repository has only the repository."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: What a file may not say, with why.
FORBIDDEN = {
    r"\.\./shared\b": "a folder beside the repository",
    r"\]\(\.\./\.\./": "a link that climbs out of the repository",
    r"\]\(https?://|^\[[^\]\n]+\]:[ \t]*https?://": "a Markdown link to a web page",
    r"\b[Ii]ssues? #?\d+\b(?!-)": "an internal issue number",
    r"\bgoal G\d+\b": "an internal planning label",
    r"\bresearch (notes|section)\b": "notes that are not in the repository",
    r"(?<![\w.])/(work|root|home)/[\w.-]+": "a path of a development machine",
}


def _tracked_text_files() -> list[Path]:
    names = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    files = []
    for name in names:
        path = ROOT / name
        if not path.is_file() or path.suffix in {".safetensors", ".png", ".gguf", ".so"}:
            continue
        files.append(path)
    return files


def _findings(text: str) -> list[str]:
    return [
        f"{why}: {m.group(0)!r}"
        for pattern, why in FORBIDDEN.items()
        for m in re.finditer(pattern, text, flags=re.MULTILINE)
    ]


def test_the_patterns_catch_what_they_should() -> None:
    # built from pieces, so that this file holds none of what it forbids
    up, machine, root = "../" + "shared", "/" + "work", "/" + "root"
    issue, label, notes = "iss" + "ue", "G" + "8", "res" + "earch"
    bad = (
        f"see {up}/design/ARCHITECTURE.md; ({issue} 7, item 5); {issue.title()} #12; goal "
        f"{label} in the {notes} notes; {machine}/devenv/bin/python; {root}/.cache"
    )
    web = "h" + "ttps://example.org"
    bad += f"; [a]({web}/x)\n[b]: {web}/y\n"
    assert len(_findings(bad)) == 9
    good = (
        "each warp issues 16-byte loads; os.path; /tmp/x; /dev/nvidiactl; spec/1.0/nvfp4.md; "
        "[the spec](spec/1.1/nvfp4.md); pip install --extra-index-url h" + "ttps://x.org/whl/cpu"
    )
    assert _findings(good) == []


def test_no_file_points_outside_the_repository() -> None:
    found = []
    for path in _tracked_text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [f"{path.relative_to(ROOT)}: {f}" for f in _findings(text)]
    assert found == [], "\n".join(found)


def test_the_license_the_metadata_names_is_in_the_tree() -> None:
    """Every distribution says Apache-2.0 in its metadata; the repository carries that
    license's text (the terms, unchanged) at its root."""
    import tomllib

    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert text.rstrip().endswith("END OF TERMS AND CONDITIONS")
    pyprojects = [*ROOT.glob("packages/*/pyproject.toml"), ROOT / "conformance" / "pyproject.toml"]
    licenses = {
        str(p.relative_to(ROOT)): tomllib.loads(p.read_text())["project"].get("license")
        for p in pyprojects
    }
    assert len(licenses) >= 10
    assert set(licenses.values()) == {"Apache-2.0"}, licenses
