"""Regenerate the README's support table from the solver registry: ``python tools/update_readme.py``."""
import pathlib
import re

import perturb
from perturb.structures import support_table

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"
START, END = "<!-- support-table:start -->", "<!-- support-table:end -->"


def render(text: str) -> str:
    block = f"{START}\n{support_table()}\n{END}"
    return re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)


if __name__ == "__main__":
    assert perturb  # importing perturb registers every solver
    README.write_text(render(README.read_text()))
    print(support_table())
