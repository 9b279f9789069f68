"""crew's errors as Python exceptions. Every message is libcrew's own one line, which names the file,
layer, key, sample, replica or rank it is about.

- bad arguments and bad input (a crew_status of CREW_CODE_INVALID_ARGUMENT or CREW_CODE_BAD_INPUT):
  ValueError, as InputError;
- out of memory: MemoryError;
- a run that failed once it started (a replica that stopped answering, replicas that diverged, a
  NaN the run was told to stop at, a disk that filled): TrainingError.
"""

# crew_code (crew.h)
OK, INVALID_ARGUMENT, BAD_INPUT, IO, OUT_OF_MEMORY, NUMERIC, TIMEOUT, DIVERGED, CANCELLED, INTERNAL = range(10)
_NAMES = {INVALID_ARGUMENT: "invalid argument", BAD_INPUT: "bad input", IO: "I/O", OUT_OF_MEMORY: "out of memory",
          NUMERIC: "numeric", TIMEOUT: "timeout", DIVERGED: "diverged", CANCELLED: "cancelled", INTERNAL: "internal"}


class CrewError(Exception):
    """Any error libcrew reported; .code is its crew_code, .message its line."""

    def __init__(self, message, code=INTERNAL):
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def kind(self):
        return _NAMES.get(self.code, "error")


class InputError(CrewError, ValueError):
    """A bad argument or bad input: what was given cannot be trained on as it is."""


class TrainingError(CrewError, RuntimeError):
    """The run failed after it started; the message names the replica or rank."""


class CrewMemoryError(CrewError, MemoryError):
    """A device or the host ran out of memory."""


def from_code(code, message, kind=None):
    if kind is not None:
        return kind(message, code)
    if code in (INVALID_ARGUMENT, BAD_INPUT):
        return InputError(message, code)
    if code == OUT_OF_MEMORY:
        return CrewMemoryError(message, code)
    return TrainingError(message, code)
