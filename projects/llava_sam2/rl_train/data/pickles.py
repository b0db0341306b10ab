"""Reading the pickles that DLC shards (``<key>.pickle``) and RefCOCO (``refs(unc).p``) ship.

Unpickling can run arbitrary code, so these files must only ever come from the user's own local
copy of the data. As a second guard the unpickler below resolves no global except plain
containers and numpy scalars/arrays, which is all those files hold; anything else is refused.
"""
from __future__ import annotations

import io
import pickle

_ALLOWED_GLOBALS = {
    ("builtins", "set"), ("builtins", "frozenset"), ("builtins", "complex"),
    ("numpy", "dtype"), ("numpy", "ndarray"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
}


class _DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(
                f"refusing to load global {module}.{name}: data pickles hold only lists, dicts, "
                "strings and numbers")
        return super().find_class(module, name)


def loads_data(payload: bytes) -> object:
    """Unpickle ``payload`` allowing plain data only (raises ``pickle.UnpicklingError`` otherwise)."""
    return _DataOnlyUnpickler(io.BytesIO(payload)).load()


def load_data_file(path: str) -> object:
    """Unpickle a local data file (see ``loads_data``)."""
    with open(path, "rb") as handle:
        return _DataOnlyUnpickler(handle).load()
