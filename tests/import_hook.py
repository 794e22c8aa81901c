"""For the sitecustomize files that tests put on PYTHONPATH: change a module once, as it is first imported."""

import importlib.abc
import importlib.util
import sys


class _OnImport(importlib.abc.MetaPathFinder):
    def __init__(self, name: str, patch):
        self.name, self.patch = name, patch

    def find_spec(self, name, path, target=None):
        if name != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            self.patch(module)

        spec.loader.exec_module = exec_module
        return spec


def on_import(name: str, patch) -> None:
    """Call patch(module) right after `name` is first imported in this process."""
    sys.meta_path.insert(0, _OnImport(name, patch))
