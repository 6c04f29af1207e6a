"""The example scripts as modules, for the tests: a fresh module object of
``examples/<name>.py``, with ``examples/`` on ``sys.path`` so that the scripts' own
``import _common`` (and ``_digits``) resolves beside them."""
import importlib.util
import pathlib
import sys

EXAMPLES_DIR = pathlib.Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str):
    """A fresh module object of ``examples/<name>.py`` (module name ``example_<name>``)."""
    if str(EXAMPLES_DIR) not in sys.path:
        sys.path.insert(0, str(EXAMPLES_DIR))
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
