"""How the benchmark scripts start `pytest --memcheck` in a subprocess."""
from importlib.metadata import entry_points


def plugin_args() -> list[str]:
    """`-p memcheck.plugin` where memcheck is not installed (a checkout on a GPU machine); installed, pytest loads it."""
    installed = any(ep.value == "memcheck.plugin" for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "memcheck.plugin"]
