"""Names a package loads on first use (PEP 562's module `__getattr__`): `import moment`, or a light module of a
package (a request the CLI reads at start), then loads none of the modules behind the package's names."""

from collections.abc import Callable
from importlib import import_module
from typing import Any


def exports(package: str, names: dict[str, str]) -> Callable[[str], Any]:
    """The `__getattr__` of `package`: each of `names` (name -> the module defining it) from its module."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
