"""The docs stay true to the tree: every relative link resolves (a file, and for a .md target with #anchor a heading
of that slug), every `python -m X` in code names a module that exists, and every docs/<file>.md path mentioned
exists. Runs on README.md and every .md under docs/ (the record included); nothing is imported but the checker's own
standard-library modules, and modules outside the repo are looked up with importlib.util.find_spec on their top
package and the files under it (so `python -m torch.distributed.run` does not import torch)."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent

FENCE = re.compile(r"^ {0,3}(```|~~~)")
ATX = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
INLINE_CODE = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)
PYTHON_M = re.compile(r"\bpython3?\s+-m\s+([A-Za-z_][\w.]*\*?)")
DOCS_PATH = re.compile(r"(?<![\w./-])docs/(?:record/)?[\w.-]+\.md\b")


def split_code(text: str) -> tuple[str, list[str]]:
    """(prose with fenced blocks blanked out, fenced blocks' contents). Line count is kept."""
    prose, blocks, block, fence = [], [], [], None
    for line in text.split("\n"):
        m = FENCE.match(line)
        if fence is None and m:
            fence, block = m.group(1), []
            prose.append("")
        elif fence is not None and line.strip().startswith(fence):
            blocks.append("\n".join(block))
            fence = None
            prose.append("")
        elif fence is not None:
            block.append(line)
            prose.append("")
        else:
            prose.append(line)
    if fence is not None:  # an unclosed fence runs to the end of the file
        blocks.append("\n".join(block))
    return "\n".join(prose), blocks


def inline_code(prose: str) -> list[str]:
    """Contents of the inline code spans (a span does not cross a blank line)."""
    out = []
    for para in re.split(r"\n\s*\n", prose):
        out += [m.group(2) for m in INLINE_CODE.finditer(para)]
    return out


def without_inline_code(prose: str) -> str:
    return "\n\n".join(INLINE_CODE.sub(lambda m: " " * len(m.group(0)), p) for p in re.split(r"\n\s*\n", prose))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed, spaces to hyphens."""
    h = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links / images: their text
    h = re.sub(r"<[^>]+>", "", h).strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a markdown text, duplicates numbered as GitHub does (x, x-1, x-2, ...)."""
    prose, _ = split_code(text)
    seen: dict[str, int] = {}
    out = set()
    for line in prose.split("\n"):
        m = ATX.match(line)
        if not m:
            continue
        s = slug(m.group(2))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def link_problems(text: str, path: Path) -> list[str]:
    prose, _ = split_code(text)
    problems = []
    for lineno, line in enumerate(without_inline_code(prose).split("\n"), 1):
        for m in LINK.finditer(line):
            target = m.group(1)
            if SCHEME.match(target):
                continue  # http(s):, mailto:, ...
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / unquote(file_part)).resolve() if file_part else path
            where = f"{path.name}:{lineno}: [..]({target})"
            if not dest.exists():
                problems.append(f"{where}: no such file {dest}")
                continue
            if anchor and dest.suffix == ".md" and unquote(anchor).lower() not in anchors(dest.read_text()):
                problems.append(f"{where}: {dest.name} has no heading with anchor #{anchor}")
    return problems


def _has_submodule(locations, name: str) -> "list[str] | None":
    """Search paths of module `name` under a package's `locations` (a list), or None if it is not there."""
    for loc in locations:
        d = Path(loc)
        if (d / name).is_dir():
            return [str(d / name)]
        if (d / f"{name}.py").is_file() or any((d / f"{name}{suf}").is_file()
                                               for suf in importlib.machinery.EXTENSION_SUFFIXES):
            return []
    return None


def module_exists(name: str, root: Path = ROOT) -> bool:
    """`python -m name` would find a module: a file of this repo, else an installed module (found without import)."""
    parts = name.split(".")
    if name.endswith("*"):  # a pattern such as dataset.build_*: some module of the repo matches it
        base = root.joinpath(*parts[:-1])
        return any(base.glob(parts[-1] + ".py")) or any(p.is_dir() for p in base.glob(parts[-1]))
    base = root.joinpath(*parts)
    if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file() or (base / "__main__.py").is_file():
        return True
    if (root / parts[0]).is_dir() or (root / f"{parts[0]}.py").is_file():
        return False  # a package of this repo that lacks the module: do not fall back to an installed namesake
    try:
        spec = importlib.util.find_spec(parts[0])
    except (ImportError, ValueError):
        return False
    if spec is None:
        return False
    locations = list(spec.submodule_search_locations or [])
    for i, part in enumerate(parts[1:], 1):
        found = _has_submodule(locations, part)
        if found is None:
            return False
        if i < len(parts) - 1 and not found:
            return False  # a plain module has no submodules
        locations = found
    return True


def module_problems(text: str, path: Path, root: Path = ROOT) -> list[str]:
    prose, blocks = split_code(text)
    problems = []
    for code in blocks + inline_code(prose):
        for m in PYTHON_M.finditer(code):
            name = m.group(1).rstrip(".")
            if not module_exists(name, root):
                problems.append(f"{path.name}: `python -m {name}`: no such module in the repo or the environment")
    return problems


def path_problems(text: str, path: Path, root: Path = ROOT) -> list[str]:
    return [f"{path.name}: mentions {p}, which does not exist" for p in sorted(set(DOCS_PATH.findall(text)))
            if not (root / p).is_file()]


def doc_problems(path: Path, root: Path = ROOT) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return link_problems(text, path) + module_problems(text, path, root) + path_problems(text, path, root)


DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


@pytest.fixture(autouse=True)
def _torch_threads():
    """Overrides conftest's fixture of this name, which imports torch (seconds) to set its thread count: these
    tests use no torch."""
    yield


@pytest.mark.parametrize("doc", DOCS, ids=[str(p.relative_to(ROOT)) for p in DOCS])
def test_doc_links_modules_and_paths_resolve(doc):
    problems = doc_problems(doc)
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------------- the checker itself

def test_slug_follows_github():
    assert slug("8. ETRM science: held-out rule instances, one command") == \
        "8-etrm-science-held-out-rule-instances-one-command"
    assert slug("How flip_rotate's bottleneck was read, in order") == "how-flip_rotates-bottleneck-was-read-in-order"
    assert slug("The demo (`python -m training.demo`, `config/cfg_demo.yaml`)") == \
        "the-demo-python--m-trainingdemo-configcfg_demoyaml"
    text = "# A\n\n```\n# not a heading\n```\n\n## A\n## B: c\n"
    assert anchors(text) == {"a", "a-1", "b-c"}


def test_checker_finds_broken_links_anchors_modules_and_paths(tmp_path):
    docs = tmp_path / "docs"
    (docs / "record").mkdir(parents=True)
    (docs / "target.md").write_text("# Target\n\n## Good section\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "tool.py").write_text("")
    page = docs / "page.md"
    page.write_text(
        "See [ok](target.md#good-section), [top](#intro), [web](https://example.com/x.md#y) and ![pic](missing.png).\n"
        "# Intro\n"
        "[gone](nowhere.md), [bad anchor](target.md#no-such-section); `[not a link](nowhere.md)` in code.\n\n"
        "Run `python -m pkg.tool` or `python -m json`, not `python -m pkg.absent` nor\n"
        "```bash\nOMP_NUM_THREADS=1 python -m surely_absent_module_xyz --out x\n[also](not-a-link.md)\n```\n"
        "Read docs/target.md and docs/record/2026-01-01-missing.md.\n")
    problems = doc_problems(page, root=tmp_path)
    text = "\n".join(problems)
    assert len(problems) == 6, text
    assert "missing.png" in text and "nowhere.md" in text and "#no-such-section" in text
    assert "pkg.absent" in text and "surely_absent_module_xyz" in text
    assert "docs/record/2026-01-01-missing.md" in text
    for fine in ("good-section", "#intro", "example.com", "pkg.tool", "`python -m json`", "not-a-link",
                 "mentions docs/target.md"):
        assert fine not in text, (fine, text)


def test_installed_modules_are_found_without_importing_them():
    assert module_exists("json") and module_exists("pytest")
    assert module_exists("email.mime.text")
    assert not module_exists("json.no_such_submodule") and not module_exists("email.mime.text.deeper")
    assert module_exists("experiments.science") and module_exists("dataset.build_*")
    assert not module_exists("dataset.no_such_builder")


def test_every_record_is_indexed_and_has_its_header():
    """docs/record/README.md lists every record, and each record opens with its date, commit, conclusion and status."""
    index = (ROOT / "docs" / "record" / "README.md").read_text(encoding="utf-8")
    records = sorted(p for p in (ROOT / "docs" / "record").glob("*.md") if p.name != "README.md")
    assert records
    missing = [p.name for p in records if f"]({p.name})" not in index]
    assert not missing, f"not in docs/record/README.md: {missing}"
    for p in records:
        assert re.match(r"\d{4}-\d{2}-\d{2}-[\w.-]+\.md$", p.name), p.name
        head = p.read_text(encoding="utf-8").split("\n---\n", 1)[0]
        for field in ("**Date:**", "**Commit:**", "**Conclusion:**", "**Status:**"):
            assert field in head, f"{p.name}: no {field} in its header"
