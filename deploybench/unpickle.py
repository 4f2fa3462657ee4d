"""One unpickler for every pickle a user hands the workflow: DLE checkpoints (through
``torch.load``, zip and legacy formats, Lightning ``.ckpt``) and TFT's ``test.bin`` /
``tgt_scalers.bin``.

Unpickling calls whatever globals the file names, so a downloaded checkpoint that names
``builtins.exec`` or ``os.system`` would run code. This unpickler resolves only:

- an explicit list of globals (``ALLOWED_GLOBALS``): the functions and classes torch and numpy
  rebuild tensors and arrays with, containers, ``argparse.Namespace``; and torch's constant
  values (dtypes, layouts, memory formats), which are not callable;
- stand-ins for library classes whose state is all the workflow needs (``STAND_INS``: sklearn's
  ``StandardScaler``, Lightning's callbacks, read without those libraries);
- classes of a training script's own code (DLE's ``configuration.ElectricityConfig``, anything
  in ``__main__``), as inert ``Placeholder`` objects that call nothing. "Own code" is a module
  that is ``__main__``, or whose top-level package is neither Python's nor importable here: its
  real code cannot be reached, so nothing it names can run.

Every other global (``builtins.eval``, ``subprocess.Popen``, ``torch.load``, ``numpy.load``,
``functools.partial``, ...) is refused with ``UnsafePickleError`` naming it, before anything is
called. A pickle may also not set attributes of a class or function it names (``BUILD`` on a
global): that would change torch's or numpy's code for the rest of the process.
"""

from __future__ import annotations

import _compat_pickle
import importlib
import importlib.util
import pickle
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, ClassVar, cast

import numpy as np

from .errors import UnsafePickleError

if TYPE_CHECKING:  # 3.11: jobs run on the V100 images' Python 3.10 too
    from typing_extensions import Self

# Globals loaded for real: each is a class or function that only builds a value from its
# arguments, whatever they are (never a module: a module holds callables that run code).
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        # Python's containers and values; bytes at pickle protocol 2 are _codecs.encode(str).
        ("collections", "OrderedDict"),
        ("builtins", "set"),
        ("builtins", "frozenset"),
        ("builtins", "bytes"),
        ("builtins", "bytearray"),
        ("builtins", "complex"),
        ("_codecs", "encode"),
        # DLE's scripts pickle their command line (TFT's checkpoint "args", nnU-Net's Lightning
        # hyper-parameters): a Namespace only sets the attributes it is given.
        ("argparse", "Namespace"),
        # Tensors and parameters as torch.save writes them (storages arrive through torch's
        # persistent_load: torch.load resolves "*Storage" names itself).
        ("torch", "Tensor"),
        ("torch", "Size"),
        ("torch", "device"),
        ("torch.nn.parameter", "Parameter"),
        ("torch._utils", "_rebuild_tensor"),
        ("torch._utils", "_rebuild_tensor_v2"),
        ("torch._utils", "_rebuild_tensor_v3"),
        ("torch._utils", "_rebuild_parameter"),
        ("torch._utils", "_rebuild_parameter_with_state"),
        ("torch._tensor", "_rebuild_from_type_v2"),
        ("torch.serialization", "_get_layout"),
        # numpy arrays, dtypes and scalars; numpy 2 spells the modules numpy._core.
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy._core.numeric", "_frombuffer"),
    }
)


class Placeholder:
    """Stands in for a class of a training script's own code (e.g. DLE's
    ``configuration.ElectricityConfig``): keeps what the pickle gives it, runs nothing.

    ``global_name`` is the class the pickle named; ``args``/``kwargs`` what it was called or
    created with, ``state`` its pickled state, ``items``/``elements`` what a dict or list
    subclass held.
    """

    global_name: ClassVar[str] = ""
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    state: Any = None

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        # Pickle creates instances with cls(*args) (REDUCE) or cls.__new__(cls, *args)
        # (NEWOBJ, protocol >= 2): both keep the arguments here.
        self = super().__new__(cls)
        self.args, self.kwargs = args, kwargs
        return self

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass  # __new__ kept the arguments

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __setitem__(self, key: Any, value: Any) -> None:
        self.__dict__.setdefault("items", {})[key] = value

    def append(self, value: Any) -> None:
        self.__dict__.setdefault("elements", []).append(value)

    def extend(self, values: Any) -> None:
        self.__dict__.setdefault("elements", []).extend(values)

    def __repr__(self) -> str:
        return f"<placeholder for {self.global_name}>"


class PickledStandardScaler:
    """The state of a pickled ``sklearn.preprocessing.StandardScaler``, read without sklearn."""

    state: dict[str, Any]

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.state = state

    def mean_std(self) -> tuple[float, float]:
        """What ``inverse_transform`` applies to the first feature: ``x * std + mean``."""
        mean, scale = self.state.get("mean_"), self.state.get("scale_")
        return (
            float(np.ravel(mean)[0]) if mean is not None else 0.0,
            float(np.ravel(scale)[0]) if scale is not None else 1.0,
        )


# Library classes DLE's files pickle whose behaviour is not needed, read as stand-ins so that
# they load whether or not the library is installed: TFT's target scalers (sklearn moved
# StandardScaler to _data in 0.22), and the callbacks Lightning < 1.5 keys its callback states
# by (a .ckpt of DLE's nnU-Net).
STAND_INS: dict[tuple[str, str], type] = {
    ("sklearn.preprocessing._data", "StandardScaler"): PickledStandardScaler,
    ("sklearn.preprocessing.data", "StandardScaler"): PickledStandardScaler,
    **{
        (f"{package}.callbacks.{module}", name): Placeholder
        for package in ("pytorch_lightning", "lightning.pytorch")
        for module, name in (
            ("model_checkpoint", "ModelCheckpoint"),
            ("early_stopping", "EarlyStopping"),
        )
    },
}


def is_own_code(module: str) -> bool:
    """Whether ``module`` is a training script's own code, not Python's or a library's:
    ``__main__``, or a top-level package that cannot be imported here (so nothing of it can be
    reached). Only the top level is looked up: finding a submodule would import its parents."""
    top = module.partition(".")[0]
    if top == "__main__":
        return True
    if not top.isidentifier() or top in sys.stdlib_module_names or top in sys.builtin_module_names:
        return False
    try:
        return importlib.util.find_spec(top) is None
    except (ImportError, ValueError):  # e.g. a module in sys.modules without a spec
        return False


def _resolve_allowed(module: str, name: str) -> Any:
    if module.startswith(("numpy.core.", "numpy._core.")):
        # A pickle written under numpy 1 or 2 names the spelling of the writer's numpy.
        submodule = module.rpartition(".")[2]
        for spelling in (f"numpy._core.{submodule}", f"numpy.core.{submodule}"):
            try:
                return getattr(importlib.import_module(spelling), name)
            except (ImportError, AttributeError):
                continue
    return getattr(importlib.import_module(module), name)


def _torch_constant(module: str, name: str) -> Any:
    """torch's dtypes, layouts, memory formats and quantisation schemes pickle as globals of
    ``torch`` (``torch.float16``); they are values, not callables. None for anything else."""
    if module != "torch":
        return None
    import torch

    value = getattr(torch, name, None)
    constants = (torch.dtype, torch.layout, torch.memory_format, torch.qscheme)
    return value if isinstance(value, constants) else None


def _describe(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or type(obj).__module__
    name = getattr(obj, "__qualname__", None) or type(obj).__qualname__
    return f"{module}.{name}"


_BUILD: Callable[..., None] = pickle._Unpickler.dispatch[pickle.BUILD[0]]


class RestrictedUnpickler(pickle._Unpickler):
    """The unpickler of every reader. The Python implementation, because its ``BUILD`` can be
    guarded; the pickles it reads are small (tensor data stays outside the pickle in torch's
    formats; arrays are one opcode each)."""

    # How messages name the file, e.g. "checkpoint /data/tft/checkpoint.pt" (``for_source``).
    source: ClassVar[str] = "pickle"
    stack: list[Any]  # the pickle machine's stack (pickle._Unpickler's)

    def __init__(self, file: IO[bytes], **kwargs: Any) -> None:
        super().__init__(file, **kwargs)
        self._placeholders: dict[str, type[Placeholder]] = {}  # one class per global named

    @classmethod
    def for_source(cls, source: str) -> type[RestrictedUnpickler]:
        """This unpickler naming ``source`` in its messages (a class: ``torch.load``
        subclasses the ``Unpickler`` of its ``pickle_module``)."""
        return cast(type[RestrictedUnpickler], type(cls.__name__, (cls,), {"source": source}))

    def find_class(self, module: str, name: str) -> Any:
        sys.audit("pickle.find_class", module, name)
        # Python 2's names (torch.save pickles at protocol 2: '__builtin__.set'); a Python 3
        # module never has them, so mapping always only makes refusals name the real global.
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
        if (module, name) in ALLOWED_GLOBALS:
            return _resolve_allowed(module, name)
        stand_in = STAND_INS.get((module, name))
        if stand_in is Placeholder:
            return self._placeholder(f"{module}.{name}")
        if stand_in is not None:
            return stand_in
        constant = _torch_constant(module, name)
        if constant is not None:
            return constant
        if is_own_code(module):
            return self._placeholder(f"{module}.{name}")
        raise UnsafePickleError(
            f"{self.source}: refuses to load global '{module}.{name}' (loading it could run "
            "code; a file may hold tensors, arrays, plain containers, argparse namespaces and "
            "classes of modules that are not installed here, such as DLE's configuration "
            "classes, read as inert placeholders)"
        )

    def _placeholder(self, global_name: str) -> type[Placeholder]:
        if global_name not in self._placeholders:
            name = global_name.rpartition(".")[2]
            attributes = {"global_name": global_name}
            self._placeholders[global_name] = type(name, (Placeholder,), attributes)
        return self._placeholders[global_name]

    def _load_build(self) -> None:
        # BUILD sets state on the object below it; a callable there is a class or function
        # the pickle named, and its attributes are code shared by the whole process.
        if len(self.stack) >= 2 and callable(self.stack[-2]):
            raise UnsafePickleError(
                f"{self.source}: refuses to set attributes of global '{_describe(self.stack[-2])}'"
            )
        _BUILD(self)

    dispatch: ClassVar[dict[int, Any]] = {
        **pickle._Unpickler.dispatch,
        pickle.BUILD[0]: _load_build,
    }


def pickle_module(source: str) -> Any:
    """A ``pickle_module`` for ``torch.load``: both its ``Unpickler`` (which torch subclasses
    and gives its ``persistent_load``) and its ``load`` (the legacy format's header records)
    are the restricted unpickler."""
    unpickler = RestrictedUnpickler.for_source(source)

    def load(file: IO[bytes], **kwargs: Any) -> Any:
        return unpickler(file, **kwargs).load()

    return types.SimpleNamespace(Unpickler=unpickler, load=load, __name__=__name__)


def load_pickle_file(path: str | Path, what: str) -> Any:
    """A plain pickle file (e.g. DLE's ``test.bin``) through the restricted unpickler; ``what``
    names the kind of file in messages. Refusals raise ``UnsafePickleError``, anything else
    unreadable a ``ValueError``."""
    file = Path(path)
    with file.open("rb") as f:
        try:
            return RestrictedUnpickler.for_source(f"{what} {file}")(f).load()
        except UnsafePickleError:
            raise
        except Exception as err:
            raise ValueError(f"{file} is not a readable {what}: {err}") from err
