"""
Builds the notebooks from their sources in notebooks/src/ and executes them, so that every
.ipynb in notebooks/ holds the outputs of a real top-to-bottom run.

    python notebooks/build.py            # all notebooks
    python notebooks/build.py 02 04      # only these
    python notebooks/build.py --check    # rebuild in memory and execute, write nothing

Edit the sources, never the .ipynb files: a source is a plain Python file in the "percent"
format (the one jupytext and VS Code read). `# %%` starts a code cell; `# %% [markdown]` starts
a markdown cell whose lines are comments ("# " is stripped). `# %% tags=["shared-data"]` marks a
code cell whose printed output depends on ../shared/data: tests/test_notebooks.py checks the
claims that read the other cells on a run that has no data (NANORM_DATA=none) too. Review the
sources in a diff; run this script to refresh the outputs before a commit. Needs nbformat, nbclient and ipykernel
(tests/requirements.txt); each notebook runs with notebooks/ as its working directory.
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "src")
KERNEL = {"name": "python3", "display_name": "Python 3", "language": "python"}


def parse(path, with_tags=False):
    """A percent-format source -> list of ("markdown" | "code", text), or of
    (kind, text, tags) with with_tags."""
    cells, kind, lines, tags = [], None, [], []

    def flush():
        text = "\n".join(lines).strip("\n")
        if kind is not None and text.strip():
            cells.append((kind, text, tags) if with_tags else (kind, text))

    with open(path, encoding="utf-8") as f:
        for line in f.read().splitlines():
            if line.startswith("# %%"):
                flush()
                kind, lines = ("markdown" if "[markdown]" in line else "code"), []
                tags = json.loads(line.split("tags=", 1)[1]) if "tags=" in line else []
            elif kind == "markdown":
                lines.append(line[2:] if line.startswith("# ") else line.lstrip("#"))
            elif kind == "code":
                lines.append(line)
    flush()
    return cells


def notebook(cells):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = KERNEL
    nb.metadata["language_info"] = {"name": "python"}
    new = {"markdown": nbformat.v4.new_markdown_cell, "code": nbformat.v4.new_code_cell}
    nb.cells = [new[kind](text) for kind, text, _ in cells]
    for i, (cell, (_, _, tags)) in enumerate(zip(nb.cells, cells)):
        cell["id"] = f"cell-{i:02d}"  # stable ids keep the diffs of a rebuild small
        if tags:
            cell.metadata["tags"] = tags
    return nb


def execute(nb, timeout=None):
    """Run every cell in notebooks/ (raises CellExecutionError if a cell raises); no time limit
    per cell unless timeout (seconds) is given: a slow CPU is not an error."""
    from nbclient import NotebookClient

    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": HERE}},
        record_timing=False,
    )
    client.execute()
    return nb


def sources():
    return sorted(f for f in os.listdir(SRC) if f.endswith(".py"))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    p.add_argument("only", nargs="*", help="notebook prefixes, e.g. 01 03")
    p.add_argument("--check", action="store_true", help="execute without writing the .ipynb")
    args = p.parse_args(argv)
    import nbformat

    chosen = [f for f in sources() if not args.only or f.split("_")[0] in args.only]
    if not chosen:
        sys.exit(f"no source matches {args.only} in {SRC}")
    for name in chosen:
        t = time.time()
        nb = execute(notebook(parse(os.path.join(SRC, name), with_tags=True)))
        out = os.path.join(HERE, name.removesuffix(".py") + ".ipynb")
        if not args.check:
            nbformat.validate(nb)
            nbformat.write(nb, out)
        size = f", {os.path.getsize(out) / 1024:.0f} KiB" if not args.check else ""
        print(f"{name}: executed in {time.time() - t:.1f}s{size}")


if __name__ == "__main__":
    main()
