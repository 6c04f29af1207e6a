"""The shared set-up and reporting of the example scripts (not part of the library).

Every script in ``examples/`` is ``main(argv=None) -> dict`` built from these pieces:

* :func:`parser` — an ``argparse`` parser with the shared flags ``--seed``, ``--device``,
  ``--out``, ``--quick``, ``--no-progress`` (and ``--threads`` when asked for). Nothing here
  imports matplotlib, tqdm or scikit-learn, so ``--help`` works without them.
* :func:`session` — the body of a run: creates ``--out``, seeds torch, sets the thread count,
  and on exit restores what it changed (threads, warning filters, ``perturb``'s validation
  switch), so that ``main`` can be called in-process (the tests do) without side effects.
* :func:`flush_denormals` — subnormal floats flushed to zero for a block (CPU speed).
* :func:`progress` — a tqdm bar when tqdm is installed, else a plain text fallback with the same
  methods (``update``, ``set_postfix``, ``set_postfix_str``, ``write``, ``close``).
* :func:`mean_std` — the one ``mean ± std`` formatter (sample std; 0 for one value).
* :func:`md_table` — a markdown table from a header and rows.
* :func:`save_plot` — imports matplotlib (Agg backend) only when a plot is drawn; without
  matplotlib it says so and skips the plot.
* :func:`write_results` — writes ``<name>.md`` and ``<name>.json`` under ``--out``.
* :func:`generator` and :func:`minibatches` — one way to make seeded generators for a device,
  and shuffled minibatch indices drawn on the generator's own device (a CUDA generator cannot
  drive a CPU ``randperm``).
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import pathlib
import statistics
import sys
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch

__all__ = ["parser", "session", "progress", "mean_std", "md_table", "save_plot",
           "write_results", "generator", "minibatches", "command_line"]


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------

class _HelpFormatter(argparse.RawDescriptionHelpFormatter,
                     argparse.ArgumentDefaultsHelpFormatter):
    """The docstring as written, and a flag's default in its help line (unless the help already
    speaks of its default, or the default is None or False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default is None or action.default is False:
            return text
        return super()._get_help_string(action)


def _device(text: str) -> str:
    """``--device``: a device this machine has (argparse prints the message and exits with
    status 2, instead of a traceback from the first allocation)."""
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"{text!r} is not a torch device (e.g. cpu, cuda, "
                                         f"cuda:1)") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise argparse.ArgumentTypeError(f"{text!r}: CUDA is not available on this machine "
                                         f"(torch.cuda.is_available() is False); use --device "
                                         f"cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{text!r}: this machine has "
                                         f"{torch.cuda.device_count()} CUDA device(s)")
    return text


def parser(doc: str | None, *, quick: str = "a short version (make demo)",
           out: str | None = None, threads: int | None = None) -> argparse.ArgumentParser:
    """A parser with the shared flags; the script adds its own.

    ``doc`` (the module docstring) is the description, shown as written. ``out``: the default
    ``--out``; None gives ``results/<script>`` for the calling script (as ``make demo`` and the
    README have it). ``threads``: when not None, a ``--threads`` flag with that default
    (``torch.set_num_threads`` in :func:`session`).
    """
    if out is None:
        caller = sys._getframe(1).f_globals.get("__file__")
        out = f"results/{pathlib.Path(caller).stem}" if caller else "results"
    p = argparse.ArgumentParser(description=doc, formatter_class=_HelpFormatter)
    p.add_argument("--seed", type=int, default=0, help="(first) random seed")
    p.add_argument("--device", default="cpu", type=_device,
                   help="torch device, e.g. cpu or cuda")
    p.add_argument("--out", default=out, help="output directory (tables, JSON, plots)")
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    if threads is not None:
        p.add_argument("--threads", type=int, default=threads,
                       help="torch CPU threads (1 is fastest on a shared machine)")
    return p


def command_line(script: str, argv: Sequence[str] | None) -> str:
    """``python examples/<script> <args>`` as run (``argv`` None: the process's own)."""
    args = sys.argv[1:] if argv is None else list(argv)
    return " ".join(["python", f"examples/{script}", *args])


@contextlib.contextmanager
def session(args: argparse.Namespace) -> Iterator[pathlib.Path]:
    """Run-wide set-up; yields the output directory.

    Creates ``args.out``, seeds torch's global generator with ``args.seed``, applies
    ``args.threads`` when the parser has it, and on exit restores the thread count, the warning
    filters and ``perturb``'s validation switch.
    """
    import perturb

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    threads = torch.get_num_threads()
    validation = perturb.validation_enabled()
    with warnings.catch_warnings():
        try:
            if getattr(args, "threads", None):
                torch.set_num_threads(args.threads)
            torch.manual_seed(args.seed)
            yield out
        finally:
            torch.set_num_threads(threads)
            perturb.set_validation(validation)


@contextlib.contextmanager
def flush_denormals() -> Iterator[None]:
    """Flush subnormal floats to zero on the CPU for the block, then restore the previous mode.

    Subnormal arithmetic is many times slower on x86 CPUs, and long box trainings are full of
    subnormals (tiny gradients, decaying Adam moments). Takes full effect only when entered
    before the process's first parallel op: intra-op worker threads copy the mode when they
    are created (called from the command line, ``main`` does that)."""
    from perturb._math import denormals_flushed

    before = denormals_flushed()
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(before)


# --------------------------------------------------------------------------------------------
# randomness
# --------------------------------------------------------------------------------------------

def generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A ``torch.Generator`` on ``device``, seeded with ``seed``."""
    return torch.Generator(device=torch.device(device)).manual_seed(seed)


def minibatches(n: int, batch_size: int, generator: torch.Generator | None = None,
                device: str | torch.device | None = None) -> Iterator[torch.Tensor]:
    """Index tensors of the minibatches of ``range(n)``, shuffled when a generator is given.

    The permutation is drawn on the generator's own device (a CUDA generator cannot drive a CPU
    ``torch.randperm``), then moved to ``device`` (default: the generator's).
    """
    if generator is None:
        order = torch.arange(n, device=device)
    else:
        order = torch.randperm(n, generator=generator, device=generator.device)
        if device is not None:
            order = order.to(device)
    for i in range(0, n, batch_size):
        yield order[i:i + batch_size]


# --------------------------------------------------------------------------------------------
# progress
# --------------------------------------------------------------------------------------------

class _PlainProgress:
    """The few tqdm methods the examples use, as plain text on stderr (about 10 lines a bar)."""

    def __init__(self, iterable: Iterable | None, total: int | None, desc: str | None,
                 disable: bool) -> None:
        self.iterable = iterable
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)
        self.total, self.desc, self.disable, self.n = total, desc or "", disable, 0
        self.postfix, self._shown = "", -1

    def __iter__(self) -> Iterator:
        for item in self.iterable:
            yield item
            self.update(1)

    def __enter__(self) -> _PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.disable:
            return
        tenth = int(10 * self.n / self.total) if self.total else self.n
        if tenth != self._shown:
            self._shown = tenth
            of = f"/{self.total}" if self.total else ""
            print(f"{self.desc}: {self.n}{of} {self.postfix}".rstrip(), file=sys.stderr)

    def set_postfix(self, ordered_dict: dict | None = None, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "") -> None:
        self.postfix = s

    @staticmethod
    def write(s: str) -> None:
        print(s)

    def close(self) -> None:
        pass


def progress(iterable: Iterable | None = None, *, total: int | None = None,
             desc: str | None = None, disable: bool = False, **kwargs: Any) -> Any:
    """A tqdm progress bar when tqdm is installed, else a plain-text one with the same methods
    (``update``, ``set_postfix``, ``set_postfix_str``, ``write``, ``close``; iteration; a
    context manager). ``kwargs`` (``unit``, ``leave``) go to tqdm only."""
    if importlib.util.find_spec("tqdm") is not None:
        from tqdm import tqdm
        return tqdm(iterable, total=total, desc=desc, disable=disable, **kwargs)
    return _PlainProgress(iterable, total, desc, disable)


# --------------------------------------------------------------------------------------------
# reporting
# --------------------------------------------------------------------------------------------

def mean_std(values: Iterable[float], digits: int = 3, scale: float = 1.0) -> str:
    """``"mean ± std"`` of ``values`` times ``scale`` with ``digits`` decimals (the sample
    standard deviation, n − 1); a single value as ``"value (1 seed)"``, since a spread of one
    value would read as a measured ± 0; ``"-"`` for none.

    >>> mean_std([0.5, 0.7]), mean_std([0.25], digits=2), mean_std([0.981, 0.95], 1, 100)
    ('0.600 ± 0.141', '0.25 (1 seed)', '96.5 ± 2.2')
    """
    xs = [scale * float(v) for v in values]
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.{digits}f} (1 seed)"
    return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}"


def md_table(header: Sequence[str], rows: Iterable[Sequence[Any]],
             float_format: str = ".4g") -> str:
    """A markdown table; float cells formatted with ``float_format``, others with ``str``.

    >>> print(md_table(["a", "b"], [["x", 0.123456], ["y", 2]]))
    | a | b |
    |---|---|
    | x | 0.1235 |
    | y | 2 |
    """
    def cell(v: Any) -> str:
        return format(v, float_format) if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_plot(path: str | pathlib.Path, draw: Callable[[Any], Any],
              dpi: int = 120) -> pathlib.Path | None:
    """``fig = draw(plt)``, then ``fig.tight_layout()``, saved to ``path`` and closed.

    matplotlib is imported here, on first use, with the Agg backend. Without matplotlib the plot
    is skipped (a note on stderr) and None is returned; otherwise the path.
    """
    path = pathlib.Path(path)
    plt = _pyplot()
    if plt is None:
        print(f"matplotlib is not installed: {path} not written", file=sys.stderr)
        return None
    fig = draw(plt)
    try:
        fig.tight_layout()
        fig.savefig(path, dpi=dpi)
    finally:
        plt.close(fig)
    return path


def _jsonable(x: Any) -> Any:
    """Tensors, tuples, paths and non-finite floats made JSON-safe (NaN/inf as strings)."""
    if isinstance(x, torch.Tensor):
        return _jsonable(x.tolist())
    if isinstance(x, dict):
        return {(k if isinstance(k, str) else " / ".join(map(str, k)) if isinstance(k, tuple)
                 else str(k)): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    if isinstance(x, (pathlib.Path, torch.device, torch.dtype)):
        return str(x)
    return x


def write_results(out: pathlib.Path, name: str, markdown: str | None = None,
                  results: Any = None) -> list[pathlib.Path]:
    """Writes ``out/<name>.md`` (when ``markdown`` is given) and ``out/<name>.json`` (when
    ``results`` is given: tensors become lists, tuple keys ``"a / b"``). Returns the paths."""
    paths = []
    if markdown is not None:
        paths.append(out / f"{name}.md")
        paths[-1].write_text(markdown if markdown.endswith("\n") else markdown + "\n")
    if results is not None:
        paths.append(out / f"{name}.json")
        paths[-1].write_text(json.dumps(_jsonable(results), indent=1))
    return paths
