"""The README's support table is the registry's listing (regenerate: python tools/update_readme.py)."""
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_support_table_is_current():
    spec = importlib.util.spec_from_file_location("update_readme", ROOT / "tools/update_readme.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    text = (ROOT / "README.md").read_text()
    assert module.render(text) == text, "README support table is stale: run tools/update_readme.py"


def test_readme_quickstart_runs(capsys):
    import re

    import torch

    code = re.search(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    torch.manual_seed(0)
    exec(compile(code, "README quickstart", "exec"), {})
    assert "| structure | regularizer |" in capsys.readouterr().out
