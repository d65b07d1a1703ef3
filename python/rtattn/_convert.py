"""Python values into C fields and arguments, each refused with an error naming its field where it would quietly
become something else: ctypes stores 2**32 + 1 in an int32 as 1 and -1 in a pointer as 2**64 - 1, ends a string at
its first NUL byte and adds a misspelt struct field as a plain Python attribute, and a flag given as "false" is true.

Every function takes the exception class to raise (ConfigError for configs and runtime options, ArgumentError for
call arguments) so that this module needs nothing from the rest of the package."""
import ctypes
import functools
import math
import operator
import os

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1

# The range of each integer type the C structs and functions use (c_size_t and c_uint64 may be the same type).
_C_RANGES = {ctypes.c_int32: (INT32_MIN, INT32_MAX), ctypes.c_int64: (-2**63, 2**63 - 1),
             ctypes.c_uint64: (0, 2**64 - 1), ctypes.c_size_t: (0, 2**(8 * ctypes.sizeof(ctypes.c_size_t)) - 1),
             ctypes.c_void_p: (0, 2**(8 * ctypes.sizeof(ctypes.c_void_p)) - 1)}


def _shown(value) -> str:
    """A value for a message: short (a 10**6-digit int or a tensor's repr would drown it) and never raising."""
    try:
        text = repr(value)
    except Exception:  # e.g. an int past Python's digit limit for str()
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 40 else text[:37] + "..."


# The C types' limits read more easily as powers of two.
_NAMED_BOUNDS = {**{2**k - 1: f"2^{k}-1" for k in (31, 63, 64)}, **{-2**k: f"-2^{k}" for k in (31, 63)}}


def _bound(n: int) -> str:
    return _NAMED_BOUNDS.get(n, str(n))


def integer(name: str, value, error, lo: int = INT32_MIN, hi: int = INT32_MAX, note: str = "") -> int:
    """value as a Python int in lo..hi. Anything with __index__ (numpy, a 0-dim integer tensor) counts; bool and float
    do not."""
    if type(value) is not int:
        if isinstance(value, bool):
            raise error(f"{name}: {value!r} is not an integer", name)
        try:
            value = operator.index(value)
        except TypeError:
            raise error(f"{name}: {_shown(value)} is not an integer", name) from None
    if lo <= value <= hi:
        return value
    raise error(f"{name}: {_shown(value)} is out of range; allowed {_bound(lo)}..{_bound(hi)}{note}", name)


def boolean(name: str, value, error) -> bool:
    """Only True or False: a flag given as a string ("false") or a number would otherwise count by its truthiness."""
    if value is True or value is False:
        return value
    raise error(f"{name}: {_shown(value)} is not True or False", name)


def number(name: str, value, error) -> float:
    """A float from an int or float (or anything with __float__ but a string or bool)."""
    if not isinstance(value, (bool, str, bytes)):
        try:
            return float(value)
        except OverflowError:
            raise error(f"{name}: {_shown(value)} is out of a double's range", name) from None
        except (TypeError, ValueError):
            pass
    raise error(f"{name}: {_shown(value)} is not a number", name)


FLOAT32_MAX = 3.4028234663852886e38


def float32(name: str, value, error) -> float:
    """A number for a float32 field: ctypes would store 1e39 as inf without a word (inf and NaN pass as given, for
    the library's own checks to name)."""
    value = number(name, value, error)
    if abs(value) > FLOAT32_MAX and abs(value) != math.inf:
        raise error(f"{name}: {_shown(value)} is out of a float32's range", name)
    return value


def cstring(name: str, value, error) -> bytes:
    """A str, bytes or path as the bytes of a C string (the file system's encoding, as Python opens paths)."""
    try:
        b = os.fsencode(value)
    except TypeError:
        raise error(f"{name}: expected a string, got {type(value).__name__}", name) from None
    except UnicodeEncodeError as e:
        raise error(f"{name}: {_shown(value)} cannot be encoded ({e.reason})", name) from None
    if b"\0" in b:
        raise error(f"{name}: {_shown(value)} contains a NUL byte, where a C string would end", name)
    return b


@functools.lru_cache(maxsize=None)
def _field_types(struct_type) -> dict:
    return dict(struct_type._fields_)


def fill(struct, error, **values):
    """Sets fields of a ctypes struct, each converted by its C type: integers and pointers range-checked (None is a
    null pointer or string), strings NUL-checked, doubles and floats from numbers (floats range-checked); nested
    structs as ctypes takes them."""
    types = _field_types(type(struct))
    for name, value in values.items():
        ctype = types.get(name)
        if ctype is None:
            raise error(f"{name}: {type(struct).__name__} has no such field", name)
        if value is None and ctype in (ctypes.c_void_p, ctypes.c_char_p):
            pass
        elif ctype in _C_RANGES:
            value = integer(name, value, error, *_C_RANGES[ctype])
        elif ctype is ctypes.c_char_p:
            value = cstring(name, value, error)
        elif ctype is ctypes.c_double:
            value = number(name, value, error)
        elif ctype is ctypes.c_float:
            value = float32(name, value, error)
        try:
            setattr(struct, name, value)
        except (TypeError, ValueError) as e:  # e.g. a nested struct given something else
            raise error(f"{name}: {e}", name) from None
    return struct
