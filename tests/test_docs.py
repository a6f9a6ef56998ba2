"""The docs stay true to the tree: every relative link resolves (a file, and for a .md target with #anchor a heading
of that slug), every `python -m X` in code names a module that exists, and every docs/<file>.md path mentioned
exists. Runs on README.md and every .md under docs/ (the record included); nothing is imported but the checker's own
standard-library modules, and modules outside the repo are looked up with importlib.util.find_spec on their top
package and the files under it (so `python -m torch.distributed.run` does not import torch). And the other way
round: every docs/<file>.md that the repo's .py / .yaml / .sh files cite exists, with the section they name."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
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
        if (d / f"{name}.py").is_file() or any(
            (d / f"{name}{suf}").is_file() for suf in importlib.machinery.EXTENSION_SUFFIXES
        ):
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
    return [
        f"{path.name}: mentions {p}, which does not exist"
        for p in sorted(set(DOCS_PATH.findall(text)))
        if not (root / p).is_file()
    ]


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
    assert (
        slug("8. ETRM science: held-out rule instances, one command")
        == "8-etrm-science-held-out-rule-instances-one-command"
    )
    assert slug("How flip_rotate's bottleneck was read, in order") == "how-flip_rotates-bottleneck-was-read-in-order"
    assert (
        slug("The demo (`python -m training.demo`, `config/cfg_demo.yaml`)")
        == "the-demo-python--m-trainingdemo-configcfg_demoyaml"
    )
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
        "Read docs/target.md and docs/record/2026-01-01-missing.md.\n"
    )
    problems = doc_problems(page, root=tmp_path)
    text = "\n".join(problems)
    assert len(problems) == 6, text
    assert "missing.png" in text and "nowhere.md" in text and "#no-such-section" in text
    assert "pkg.absent" in text and "surely_absent_module_xyz" in text
    assert "docs/record/2026-01-01-missing.md" in text
    for fine in (
        "good-section",
        "#intro",
        "example.com",
        "pkg.tool",
        "`python -m json`",
        "not-a-link",
        "mentions docs/target.md",
    ):
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


# ------------------------------------------------------------------------ citations of the docs in code and configs
# Code, configs and scripts cite the docs as docs/<file>.md, optionally followed by a section: `§N` (a numbered
# heading) and / or a quoted title after ", " or " " (`docs/x.md, "Title"`, `docs/x.md 'Title'`, `docs/x.md
# ("Title")`; a title may continue on the next line of a comment or docstring). The file must exist and the title
# must be a heading of it: compared case-insensitively, markup and a heading's "N. " numbering ignored, and the
# heading may go on after the quoted title (`"Checkpoints and resume"` names "Checkpoints and resume
# (training/checkpoint.py)"). A stated fact with its commit and record file beats a pointer to a section.

CODE_SUFFIXES = (".py", ".yaml", ".yml", ".sh", ".sbatch", ".toml")
SKIP_DIRS = {
    ".git",
    ".venv",
    ".venv-ci",
    ".hypothesis",
    ".pytest_cache",
    ".ruff_cache",
    "__pycache__",
    "build",
    "data",
    "checkpoints",
    "outputs",
    "multirun",
    "wandb",
    "runs",
    "logs",
    "node_modules",
}
CITATION = re.compile(
    r"(?<![\w./-])(docs/[\w./-]+?\.md)\b"  # the file
    r"(?:[ \t]*§[ \t]*(\d+))?"  # §N
    r"(?:,?[ \t]*\(?(\\?)([\"'])"  # the opening quote of a title (escaped inside a Python string, or not)
    r"([A-Za-z0-9](?:(?!\4)[^\n\\]|\n[ \t]*#*[ \t]*){0,200}?)\3\4)?"
)  # the title, up to the same closing quote
OPEN_TITLE = re.compile(r",?[ \t]*\(?\\?[\"'][A-Za-z0-9]")  # a title that opens where CITATION read none
NUMBERED = re.compile(r"^(\d+)\.\s+")


def _plain_heading(text: str) -> str:
    h = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links / images: their text
    h = re.sub(r"[`*_]|<[^>]+>", "", h)
    return " ".join(h.split()).lower()


def headings(text: str) -> list[str]:
    """The headings of a markdown text (outside fenced code), plain and lower case."""
    prose, _ = split_code(text)
    return [_plain_heading(m.group(2)) for m in map(ATX.match, prose.split("\n")) if m]


def title_matches(title: str, heading: str) -> bool:
    """Whether a quoted section title names `heading` (both plain and lower case): equal, or the heading goes on
    after it past a word boundary; with or without the heading's "N. " numbering."""
    for h in (heading, NUMBERED.sub("", heading)):
        if h == title or (h.startswith(title) and not h[len(title)].isalnum()):
            return True
    return False


def citation_problems(path: Path, root: Path = ROOT, cache: dict[Path, list[str]] | None = None) -> list[str]:
    text = path.read_text(encoding="utf-8", errors="replace")
    cache = {} if cache is None else cache
    problems = []
    for m in CITATION.finditer(text):
        doc, number, title = m.group(1), m.group(2), m.group(5)
        where = f"{path.relative_to(root)}:{text.count(chr(10), 0, m.start()) + 1}: {doc}"
        target = root / doc
        if not target.is_file():
            problems.append(f"{where}: no such file")
            continue
        if target not in cache:
            cache[target] = headings(target.read_text(encoding="utf-8"))
        heads = cache[target]
        if number and not any(h.startswith(f"{number}.") for h in heads):
            problems.append(f"{where} §{number}: {doc} has no heading numbered {number}.")
        if title is None and OPEN_TITLE.match(text, m.end()):
            problems.append(
                f"{where}: a quoted section title that does not close on the quote it opened with (split "
                f"across string literals?): keep the title in one piece"
            )
        if title:
            plain = " ".join(re.sub(r"\n[ \t]*#*", " ", title).split()).lower().rstrip(" .…:;,")
            if not any(title_matches(plain, h) for h in heads):
                problems.append(f'{where}, "{" ".join(title.split())}": {doc} has no such heading')
    return problems


def code_files(root: Path = ROOT) -> list[Path]:
    """The repo's code, config and script files (not the virtual environment, caches, data or runs)."""
    out = []
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.endswith(".egg-info"))
        out += [Path(d) / f for f in sorted(files) if f.endswith(CODE_SUFFIXES)]
    return out


def test_code_citations_of_the_docs_resolve():
    """Every docs/<file>.md that code, a config or a script cites exists, and so does the section it names. This
    file is left out: its checker tests cite missing files and sections on purpose."""
    cache: dict[Path, list[str]] = {}
    files = [p for p in code_files() if p != Path(__file__).resolve()]
    assert any(p.name == "cfg_science.yaml" for p in files) and any(p.suffix == ".sh" for p in files)
    problems = [msg for p in files for msg in citation_problems(p, cache=cache)]
    assert not problems, "\n".join(problems)


def test_reference_docs_citations_of_other_docs_sections_resolve():
    """The same for the reference pages (README, docs/*.md; the dated record keeps its words as written)."""
    cache: dict[Path, list[str]] = {}
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    problems = [msg for p in pages for msg in citation_problems(p, cache=cache)]
    assert not problems, "\n".join(problems)


def test_citation_checker_catches_stale_sections_and_files(tmp_path):
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "target.md").write_text(
        "# Target\n\n## 2. Good section: more (`x.py`)\n\n```\n## Fenced title\n```\n### The recipe\n"
    )
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "ok.py").write_text(
        '"""See docs/target.md, "Good section" and docs/target.md §2, docs/target.md ("the recipe").\n'
        'Also docs/target.md "Good\n    section: more" and docs/target.md \'good section: more (x.py)\'."""\n'
        'MSG = "(docs/target.md, \\"The recipe\\")"  # docs/target.md, "Good\n# section"; docs/target.md.\n'
    )
    (tmp_path / "pkg" / "stale.py").write_text(
        'X = 1  # docs/target.md, "Stale section"\n'
        'MSG = "see docs/target.md, \\"Fenced title\\""\n'
        '"""docs/target.md §7 and docs/target.md "Good sect" and docs/gone.md."""\n'
        'MSG2 = ("see docs/target.md, \\"Good "\n       "section\\"")\n'
    )
    (tmp_path / "cfg.yaml").write_text("a: 1  # docs/target.md 'Recipe'\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / ".venv" / "skip.py").write_text('# docs/target.md, "Not checked"\n')
    files = code_files(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in files] == ["cfg.yaml", "pkg/ok.py", "pkg/stale.py"]
    assert citation_problems(tmp_path / "pkg" / "ok.py", root=tmp_path) == []
    problems = [m for p in files for m in citation_problems(p, root=tmp_path)]
    text = "\n".join(problems)
    assert len(problems) == 7, text
    for stale in (
        'cfg.yaml:1: docs/target.md, "Recipe"',
        'stale.py:1: docs/target.md, "Stale section"',
        '"Fenced title"',
        "§7",
        '"Good sect"',
        "docs/gone.md: no such file",
        "stale.py:4: docs/target.md: a quoted section title that does not close",
    ):
        assert stale in text, (stale, text)


# --------------------------------------------------------------------------------- figures the docs restate
def test_the_demos_lr_and_eval_figure_are_stated_alike_everywhere():
    """The demo's learning rate as the getting-started page and docs/training.md state it is config/cfg_demo.yaml's,
    and the demo checkpoint's eval exact accuracy that docs/evaluation.md quotes is the one measured in
    docs/training.md (and quoted in the README), at the same commit."""
    import yaml

    lr = yaml.safe_load((ROOT / "config" / "cfg_demo.yaml").read_text(encoding="utf-8"))["lr"]
    for page in ("getting_started.md", "training.md"):
        text = (ROOT / "docs" / page).read_text(encoding="utf-8")
        stated = re.search(r"\blr (\d(?:\.\d+)?e-\d+)", text)
        assert stated and float(stated.group(1)) == float(lr), (page, stated and stated.group(0), lr)
    measured = re.search(
        r"at `[0-9a-f]+` and again at `([0-9a-f]+)`.*?eval exact ([0-9.]+)",
        (ROOT / "docs" / "training.md").read_text(encoding="utf-8"),
        re.S,
    )
    commit, figure = measured.groups()
    quoted = re.search(
        r"measured at `([0-9a-f]+)`: all\.exact_accuracy ([0-9.]+) on its 200 test puzzles",
        (ROOT / "docs" / "evaluation.md").read_text(encoding="utf-8"),
    )
    assert quoted and quoted.groups() == (commit, figure), (quoted and quoted.groups(), commit, figure)
    assert f"({figure} in " in (ROOT / "README.md").read_text(encoding="utf-8")
