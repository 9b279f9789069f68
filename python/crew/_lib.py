"""libcrew through ctypes: the library's functions, its structs by name, its errors as exceptions.

libcrew.so lies beside this file in an installed package (pip builds it with the project's CMake);
CREW_LIBRARY names another one. ctypes releases the GIL during every call into it, so a training
run leaves the interpreter free (crew.fit waits on it from the main thread, see _fit.py).

The structs are read and set by member name through the library's own table of them
(crew_struct_fields): their layout is never written down a second time here.
"""
import ctypes
import ctypes.util
import os

from . import errors

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load():
    path = os.environ.get("CREW_LIBRARY") or os.path.join(_HERE, "libcrew.so")
    if not os.path.exists(path):
        raise ImportError(f"crew: {path} is missing: install the package with pip (pip install . in crew's "
                          "repository), or set CREW_LIBRARY to a libcrew.so built with -DSKBUILD=ON")
    return ctypes.CDLL(path)


lib = _load()

c_status = ctypes.c_void_p  # crew_status: NULL is success
p = ctypes.c_void_p


def _fn(name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    return f


c_char_pp = ctypes.POINTER(ctypes.c_char_p)
c_float_pp = ctypes.POINTER(ctypes.POINTER(ctypes.c_float))
c_i64_p = ctypes.POINTER(ctypes.c_int64)

_fn("crew_status_code", ctypes.c_int, c_status)
_fn("crew_status_message", ctypes.c_char_p, c_status)
_fn("crew_status_free", None, c_status)
_fn("crew_version", ctypes.c_char_p)
_fn("crew_struct_fields", p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int))
_fn("crew_struct_name", ctypes.c_char_p, ctypes.c_int)
_fn("crew_cpu_cores", ctypes.c_int)
_fn("crew_devices_parse", c_status, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int))
# models
_fn("crew_model_parse_json", c_status, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.POINTER(p))
_fn("crew_model_load_file", c_status, ctypes.c_char_p, ctypes.POINTER(p))
_fn("crew_model_free", None, p)
_fn("crew_model_param_count", ctypes.c_int64, p)
_fn("crew_model_output_size", ctypes.c_int64, p)
_fn("crew_model_tensor_count", ctypes.c_int, p)
_fn("crew_model_tensor_info", ctypes.c_int, p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, c_i64_p)
_fn("crew_model_get_tensors", c_status, p, c_float_pp)
_fn("crew_model_set_tensors", c_status, p, c_float_pp)
_fn("crew_model_save_weights", c_status, p, ctypes.c_char_p)
_fn("crew_model_save_weights_progress", c_status, p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64)
_fn("crew_model_load_weights", c_status, p, ctypes.c_char_p)
_fn("crew_model_evaluate", c_status, p, p, ctypes.c_int64, p)
_fn("crew_model_predict", c_status, p, ctypes.POINTER(ctypes.c_float), ctypes.c_int64, ctypes.POINTER(ctypes.c_float))
_fn("crew_model_default_fit", None, p, p)
# data
_fn("crew_dataset_from_arrays", c_status, p, ctypes.POINTER(p))
_fn("crew_dataset_open_for", c_status, p, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(p))
_fn("crew_dataset_free", None, p)
_fn("crew_dataset_size", ctypes.c_int64, p)
_fn("crew_dataset_note", ctypes.c_char_p, p)
_fn("crew_prep_arrays", c_status, p, p, ctypes.c_double, ctypes.c_uint64, ctypes.c_char_p, p, p)
# fits
_fn("crew_fit_prepare", c_status, p, p, p, ctypes.POINTER(p))
_fn("crew_fit_get_plan", p, p)
_fn("crew_fit_resume_note", ctypes.c_char_p, p)
_fn("crew_fit_run", c_status, p, p)
_fn("crew_fit_free", None, p)
_fn("crew_fit_plan_text", ctypes.c_size_t, p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t)
_fn("crew_fit_scaling_hint", ctypes.c_int, p, p, ctypes.c_char_p, ctypes.c_size_t)
_fn("crew_report_write", c_status, ctypes.c_char_p, ctypes.c_char_p)
_fn("crew_run_peak", ctypes.c_double, ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int,
    ctypes.POINTER(ctypes.c_double))
# run directories
_fn("crew_run_dir_choose", None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t)
_fn("crew_run_dir_holds", ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t)
_fn("crew_run_dir_usable", c_status, ctypes.c_char_p)
_fn("crew_run_dir_check_resume", c_status, ctypes.c_char_p)
_fn("crew_run_dir_check_links", c_status, ctypes.c_char_p)
_fn("crew_run_dir_follow", c_status, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t)
_fn("crew_run_dir_clear", c_status, ctypes.c_char_p)
_fn("crew_run_dir_create", c_status, ctypes.c_char_p)
_fn("crew_run_dir_write_config", c_status, ctypes.c_char_p, p)
_fn("crew_run_lock_take", c_status, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(p))
_fn("crew_run_lock_note", ctypes.c_char_p, p)
_fn("crew_run_lock_release", None, p)
# processes
_fn("crew_launched_by_mpi", ctypes.c_int)
_fn("crew_mpi_start", c_status, ctypes.c_double, ctypes.POINTER(p))
_fn("crew_mpi_stop", None, ctypes.c_int)
_fn("crew_group_rank", ctypes.c_int, p)
_fn("crew_group_size", ctypes.c_int, p)
_fn("crew_group_broadcast", c_status, p, p, ctypes.c_size_t, ctypes.c_double, ctypes.c_char_p)
_fn("crew_group_close", None, p)


def check(status, kind=None):
    """Raises the exception of a crew_status (and frees it); nothing for success."""
    if not status:
        return
    code = lib.crew_status_code(status)
    message = lib.crew_status_message(status).decode("utf-8", "replace")
    lib.crew_status_free(status)
    raise errors.from_code(code, message, kind)


def text(s):
    return None if s is None else os.fsencode(s) if isinstance(s, (str, os.PathLike)) else s


# ---------------------------------------------------------------- structs by name

INT, INT64, UINT64, FLOAT, DOUBLE, STRING, CHARS, POINTER = range(1, 9)
_CTYPE = {INT: ctypes.c_int, INT64: ctypes.c_int64, UINT64: ctypes.c_uint64, FLOAT: ctypes.c_float,
          DOUBLE: ctypes.c_double, STRING: ctypes.c_char_p, POINTER: ctypes.c_void_p}


class _Field(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("type", ctypes.c_int), ("offset", ctypes.c_size_t),
                ("count", ctypes.c_int)]


_layouts = {}


def layout(struct_name):
    """{member name: (type, offset, count)} and the size of one of crew's structs."""
    if struct_name not in _layouts:
        size, n = ctypes.c_size_t(), ctypes.c_int()
        at = lib.crew_struct_fields(struct_name.encode(), ctypes.byref(size), ctypes.byref(n))
        if not at:
            raise KeyError(f"libcrew describes no struct {struct_name}")
        rows = ctypes.cast(at, ctypes.POINTER(_Field))
        fields = {rows[i].name.decode(): (rows[i].type, rows[i].offset, rows[i].count) for i in range(n.value)}
        _layouts[struct_name] = (fields, size.value)
    return _layouts[struct_name]


class Struct:
    """One of crew's structs in memory this object owns (or at an address it was given), its members
    read and set by name: s["epochs"] = 3. Text set into a const char * member is kept alive here."""

    def __init__(self, struct_name, address=None):
        object.__setattr__(self, "_fields", layout(struct_name)[0])
        object.__setattr__(self, "name", struct_name)
        size = layout(struct_name)[1]
        if address is None:
            buf = (ctypes.c_char * size)()
            object.__setattr__(self, "_buf", buf)
            address = ctypes.addressof(buf)
        object.__setattr__(self, "address", address)
        object.__setattr__(self, "_keep", {})

    def __contains__(self, key):
        return key in self._fields

    def fields(self):
        return list(self._fields)

    def _at(self, key):
        try:
            return self._fields[key]
        except KeyError:
            raise KeyError(f"{self.name} has no member '{key}'") from None

    def __getitem__(self, key):
        kind, offset, count = self._at(key)
        if kind == CHARS:
            return ctypes.string_at(self.address + offset).decode("utf-8", "replace")
        ct = _CTYPE[kind]
        if count > 1:
            return list((ct * count).from_address(self.address + offset))
        v = ct.from_address(self.address + offset).value
        return v.decode("utf-8", "replace") if kind == STRING and v is not None else v

    def __setitem__(self, key, value):
        kind, offset, count = self._at(key)
        if kind == CHARS or count > 1:
            raise TypeError(f"{self.name}.{key} is the library's to fill in")
        if kind == STRING:
            value = text(value)
            self._keep[key] = value
        elif kind == POINTER and value is not None and not isinstance(value, int):
            self._keep[key] = value
            value = ctypes.cast(value, ctypes.c_void_p).value
        _CTYPE[kind].from_address(self.address + offset).value = value

    def kind(self, key):
        return self._at(key)[0]

    def dict(self):
        """Every member but pointers, as Python values."""
        return {k: self[k] for k, (kind, _, _) in self._fields.items() if kind != POINTER}

    @property
    def ptr(self):
        return ctypes.c_void_p(self.address)
